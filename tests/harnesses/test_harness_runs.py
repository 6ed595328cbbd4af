"""Each installed harness, unchanged and headless, completes a tool-using turn against the capture server.

The capture server scripts one call of the harness's own shell tool (``echo hello > hi.txt && cat hi.txt``)
and then an answer, so this proves the install runs offline end to end: the harness reaches the base
URL it is given, accepts the protocol's replies, really executes the tool, and sends the result back.
Where strace is installed, it also proves nothing else was contacted: no connection or DNS query to any
address but loopback.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.harnesses.capture import RUNS, TOOL_DONE, capture, offered_tools

pytestmark = pytest.mark.e2e

STRACE = shutil.which("strace") is not None


@pytest.mark.parametrize("run", ["claude", "codex", "pi", "openclaw"])
def test_harness_completes_a_tool_turn_offline(run: str, tmp_path: Path) -> None:
    # The proof that nothing leaves the machine needs strace (make setup-harnesses installs it).
    assert STRACE, "strace is missing: run `make setup-harnesses` (it installs Debian's strace)"
    summary = capture(RUNS[run], "tool", out_dir=tmp_path, use_strace=STRACE, timeout=600)
    stem = f"{run}-tool"
    log = (tmp_path / f"{stem}.out.txt").read_text()
    assert summary["rc"] == 0, log[-4000:]
    assert summary["hi.txt"] == "hello", log[-4000:]
    if STRACE:
        assert summary["outside_traffic"] == [], log[-4000:]
    records = [json.loads(line) for line in (tmp_path / f"{stem}.jsonl").read_text().splitlines()]
    model_calls = [r for r in records if r["method"] == "POST" and not r["path"].endswith("count_tokens")]
    assert len(model_calls) >= 2, [r["path"] for r in records]
    assert RUNS[run].shell.name in offered_tools(model_calls[0]["body"])
    assert TOOL_DONE in log  # the harness printed the answer that followed the tool's result
    assert "hello" in json.dumps(model_calls[-1]["body"])  # the tool's output went back to the model
