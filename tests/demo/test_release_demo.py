"""Safe policy release on live traffic, short: ``tokentrail demo --release`` as a person would run it.

It runs in a private state directory with a Kafka broker of its own on free ports (the demo does that
itself, so it never touches the shared broker). The shorter plan (tests/demo/release-ci.yaml)
has two ramp stages instead of three; the rules and their error bounds are the demo's. Checked from what it
prints last: the good candidate was promoted and the bad one (trained on the flipped reward) rolled back by
the controller, the figures are there, and the audit passed on everything stored.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tokentrail.settings import REPO_ROOT

pytestmark = pytest.mark.e2e

CI_PLAN = Path(__file__).with_name("release-ci.yaml")
KEYS = {"promoted", "rolled_back", "bad_candidate_sessions_fraction", "rollback_after_s", "audit_passed"}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_release_demo_promotes_the_good_candidate_and_rolls_back_the_bad_one(tmp_path: Path) -> None:
    state = tmp_path / "release-demo"
    command = [sys.executable, "-m", "tokentrail.cli", "demo", "--release", "--state-dir", str(state),
               "--plan", str(CI_PLAN), "--group-size", "4", "--concurrency", "2", "--drain-s", "60",
               "--phase-timeout-s", "420"]
    # Its own process group, so that on a timeout the demo's services go with it; then its own broker is
    # stopped by its data directory (the pid there), never another.
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=1500)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        subprocess.run([sys.executable, "-m", "tokentrail.cli", "kafka", "stop"], cwd=REPO_ROOT, timeout=180,
                       capture_output=True, env={**os.environ, "TOKENTRAIL_KAFKA__DATA_DIR": str(state / "kafka")})
    report = _failure_report(output, state / "logs")
    summary = json.loads(output.strip().splitlines()[-1])
    assert summary.keys() >= KEYS, report
    assert summary["promoted"] and summary["promote_rule"] == "reward_better", report
    assert summary["rolled_back"], report
    assert summary["rollback_rule"] in ("reward_worse", "error_rate", "latency_ratio"), report
    assert 0 < summary["bad_candidate_sessions_fraction"] < 1, report
    assert summary["rollback_after_s"] > 0, report
    assert summary["audit_passed"], report
    assert process.returncode == 0, report
    # The versions are what the demo says: the good candidate answers right far more often than the bad one.
    rewards = summary["reward_by_version"]
    assert rewards["2"] > rewards["3"], report
    assert Path(summary["report"]).stat().st_size > 10_000
    assert not (state / "kafka" / "broker.pid").exists()  # its own broker is stopped


def _failure_report(output: str, logs: Path) -> str:
    parts = [output[-6000:]]
    for log in sorted(logs.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        parts.append(f"----- {log.name} (last 40 of {len(lines)} lines)\n" + "\n".join(lines[-40:]))
    return "\n".join(parts)
