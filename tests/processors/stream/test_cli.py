"""``tokentrail process``: help, and clear CLI errors for bad configuration (before touching Kafka)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tokentrail.settings import REPO_ROOT


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokentrail.cli", "process", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def test_process_help_lists_the_worker_options() -> None:
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    for option in ("--loglevel", "--topic-prefix", "--app-id", "--verifiers", "--session-timeout"):
        assert option in result.stdout


def test_bad_configuration_is_a_cli_error_not_a_traceback(tmp_path: Path) -> None:
    missing = run_cli("--grouping-config", str(tmp_path / "absent.yaml"))
    assert missing.returncode == 2
    assert "cannot read grouping config" in missing.stderr and "Traceback" not in missing.stderr

    verifiers = tmp_path / "verifiers.yaml"
    verifiers.write_text("- ref: no.such.module:Verifier\n")
    bad = run_cli("--verifiers", str(verifiers))
    assert bad.returncode == 2
    assert "cannot import no.such.module" in bad.stderr and "Traceback" not in bad.stderr
