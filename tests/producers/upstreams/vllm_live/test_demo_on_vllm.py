"""``tokentrail demo --upstream vllm``, short, on the session's real vLLM (``--vllm-url``: the server
start is paid once for all live tests): the whole online loop with the trainer's versions pushed into
vLLM, in a private var dir and Kafka broker. Checks the demo's last line: every stored call's recorded
version equals the version vLLM reports it sampled the call's tokens with (none unreported, none
mismatched), vLLM served at least two versions, no request failed, and the audit passed. Whether the
reward rose is not asserted: one minute is too short for that (the full run is reported in
docs/weight-sync.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.policy_store import PolicyStore
from schemas.local_paths import REPO_ROOT
from testkit.gateway import free_port

from .test_weight_sync_live import restore_base
from .vllm_server import VLLMServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

KEYS = ("reward_improved", "audit_passed", "versions_served_by_vllm", "calls", "failed_requests",
        "version_mismatches", "calls_without_vllm_version", "calls_checked_against_vllm")


def test_the_demo_on_vllm_records_the_version_vllm_served_every_call_with(
    vllm_server: VLLMServer, live_model_dir: Path, tmp_path: Path,
) -> None:
    var = tmp_path / "var"
    env = {
        **os.environ,
        "TOKENTRAIL_VAR_DIR": str(var),  # its Kafka data, chDB, policy store and logs; never the shared ones
        "TOKENTRAIL_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "TOKENTRAIL_KAFKA__CONTROLLER_PORT": str(free_port()),
        "TOKENTRAIL_KAFKA__HEAP": "512m",
        "TOKENTRAIL_GATEWAY__PORT": str(free_port()),
        "TOKENTRAIL_MODEL__DIR": str(live_model_dir),
    }
    command = [sys.executable, "-m", "tokentrail.cli", "demo", "--upstream", "vllm", "--vllm-url", vllm_server.url,
               "--minutes", "1", "--group-size", "4", "--concurrency", "1", "--train-batch", "4",
               "--drain-s", "45"]
    try:
        result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800)
    finally:
        subprocess.run([sys.executable, "-m", "tokentrail.cli", "kafka", "stop"], cwd=REPO_ROOT, env=env,
                       capture_output=True, timeout=120)
        restore_base(vllm_server, live_model_dir, PolicyStore(tmp_path / "restore"))  # shared with other tests
    report = _failure_report(result.stdout + result.stderr, var / "logs")
    assert result.returncode == 0, report
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(KEYS) <= set(summary), report
    assert summary["audit_passed"], report
    assert summary["calls"] > 0 and summary["failed_requests"] == 0, report
    assert summary["calls_checked_against_vllm"] == summary["calls"], report
    assert (summary["version_mismatches"], summary["calls_without_vllm_version"]) == (0, 0), report
    assert summary["versions_served_by_vllm"] >= 2, report


def _failure_report(output: str, logs: Path) -> str:
    parts = [output[-6000:]]
    for log in sorted(logs.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        parts.append(f"----- {log.name} (last 40 of {len(lines)} lines)\n" + "\n".join(lines[-40:]))
    return "\n".join(parts)
