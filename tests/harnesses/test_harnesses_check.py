"""``tokentrail harnesses check`` reports the harnesses it cannot run through the gateway yet as not passing,
with the reason, in its table and its last-line JSON, and exits 1 when a harness asked for did not pass.
(The harnesses it does run, Pi and Claude Code, are the runs of test_through_gateway.py and
test_claude_through_gateway.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokentrail.cli import main


def test_harnesses_not_run_yet_are_reported_not_passing_with_the_reason(
        harness_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No gateway is contacted for them: the URL points nowhere.
    assert main(["harnesses", "check", "--only", "codex,openclaw", "--gateway", "http://127.0.0.1:9"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["harnesses"] == ["codex", "openclaw"] and summary["harnesses_passed"] == []
    assert summary["calls"] == summary["token_exact_calls"] == 0 and summary["spliced_fraction"] == 0.0
    assert "namespace/custom tools" in summary["per_harness"]["codex"]["reason"]
    assert lines[0].split()[:3] == ["harness", "passed", "calls"]
    assert lines[1].startswith("codex") and " no " in lines[1]
