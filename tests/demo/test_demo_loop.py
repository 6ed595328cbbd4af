"""The main job, short: the whole online loop on its own broker, ClickHouse and policy store.

Runs ``tokentrail demo`` as a person would, in a private ``TOKENTRAIL_VAR_DIR`` with a private
Kafka broker on free ports, and checks what it prints last: reward rose from the first band of
policy versions to the last, and the five audit checks passed on everything it stored; the release
guard ran beside it and decided nothing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tokentrail.settings import REPO_ROOT, get_settings

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_short_online_loop_improves_reward_and_passes_audit(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TOKENTRAIL_VAR_DIR": str(tmp_path / "var"),
        "TOKENTRAIL_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{_free_port()}",
        "TOKENTRAIL_KAFKA__CONTROLLER_PORT": str(_free_port()),
        "TOKENTRAIL_KAFKA__HEAP": "512m",
        "TOKENTRAIL_GATEWAY__PORT": str(_free_port()),
        # The model build is deterministic and cached; share it with the rest of the suite.
        "TOKENTRAIL_MODEL__DIR": str(get_settings().model.dir),
    }
    # Ends at 100 trainer steps (about 80 s on a quiet machine): the reward depends on steps, so a loaded
    # machine runs longer rather than training less; 6 minutes bounds it.
    command = [sys.executable, "-m", "tokentrail.cli", "demo", "--minutes", "6", "--until-steps", "100",
               "--drain-s", "90"]
    try:
        result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)
    finally:
        subprocess.run([sys.executable, "-m", "tokentrail.cli", "kafka", "stop"], cwd=REPO_ROOT, env=env,
                       capture_output=True, timeout=120)
    report = _failure_report(result.stdout + result.stderr, tmp_path / "var" / "logs")
    assert result.returncode == 0, report
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["audit_passed"], report
    assert summary["policy_versions"] >= 5, report
    assert summary["reward_last_band"] > summary["reward_first_band"], report
    assert Path(summary["report"]).stat().st_size > 10_000
    # The release guard ran beside it (controller, gateway and trainer following the decisions) and, with no
    # release started, changed nothing: it followed the calls and decided nothing.
    assert summary["release_decisions"] == 0 and summary["release_controller_calls"] > 0, report


def _failure_report(output: str, logs: Path) -> str:
    """What the demo printed, then the end of every service's log: enough to see which stage stopped."""
    parts = [output[-6000:]]
    for log in sorted(logs.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        parts.append(f"----- {log.name} (last 40 of {len(lines)} lines)\n" + "\n".join(lines[-40:]))
    return "\n".join(parts)
