"""``tokentrail harnesses check`` (issue 18 item 8), the CI run: every harness that runs through the gateway
(Pi, Claude Code, OpenClaw; Codex CLI once it does) does its scripted task of three calls with two real shell
runs, unchanged, in a throwaway HOME and working directory, against a gateway of the check's own on the harness
model; the table and the last-line JSON report every call token-exact, the outputs as the harness received
them, the attempt COMPLETE, the spliced pairs and the named causes of each prefix break. A harness not run
yet is listed as not passing, with the reason.

This is the one real run of each harness in the suite: the per-harness tests (test_through_gateway.py,
test_claude_through_gateway.py, test_openclaw_through_gateway.py) read its records instead of running again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harnesses.check_run import CheckRun
from tokentrail.cli import main
from tokentrail.commands.harnesses import HARNESSES, NOT_YET

pytestmark = pytest.mark.e2e

ALL_FOUR = {"pi", "claude", "codex", "openclaw"}


def test_the_check_runs_every_harness_through_the_gateway_and_each_passes(harnesses_check: CheckRun) -> None:
    run, summary = harnesses_check, harnesses_check.summary
    assert set(summary["harnesses"]) == ALL_FOUR == set(HARNESSES) | set(NOT_YET)
    failures = {n: r["reason"] for n, r in summary["per_harness"].items() if n in HARNESSES and not r["passed"]}
    assert not failures, (failures, run.log[-4000:])
    assert run.exit_code == 0
    assert summary["harnesses_passed"] == list(HARNESSES) and {"pi", "claude", "openclaw"} <= set(HARNESSES)
    assert summary["calls"] == summary["token_exact_calls"] == 3 * len(HARNESSES)
    for name in HARNESSES:
        row = summary["per_harness"][name]
        assert row["calls"] == row["token_exact_calls"] == row["outputs_as_received"] == 3, (name, row)
        assert row["rollout"] == "COMPLETE" and row["protocols"] == [HARNESSES[name].protocol], (name, row)
        # Every pair that did not splice has a named cause (never left unexplained).
        broken = {int(c.split(":")[0].removeprefix("call ")) for c in row["break_causes"]}
        assert len(broken) == row["pairs"] - row["spliced_calls"], (name, row)
        assert not any(": other" in c for c in row["break_causes"]), (name, row)

    rows = summary["per_harness"]
    assert rows["claude"]["routes"] == ["POST /v1/messages"] and rows["claude"]["spliced_calls"] == 2
    assert rows["pi"]["routes"] == rows["openclaw"]["routes"] == ["POST /v1/chat/completions"]
    # Pi and OpenClaw send the tool call's arguments back as compact JSON; OpenClaw also resends its internal
    # context message after the tool result, so neither splices.
    assert rows["pi"]["break_causes"] == [f"call {i}: re-serialized tool arguments" for i in (1, 2)]
    assert rows["openclaw"]["break_causes"] == [f"call {i}: {cause}" for i in (1, 2)
                                                for cause in ("injected reminder", "re-serialized tool arguments")]
    spliced = sum(r.get("spliced_calls", 0) for r in rows.values())
    pairs = sum(r.get("pairs", 0) for r in rows.values())
    assert summary["spliced_fraction"] == round(spliced / pairs, 3)

    # The table: one line per harness, in the JSON's order, passed or not, then its prefix-break causes.
    assert run.lines[-1] == json.dumps(summary)
    header = next(i for i, line in enumerate(run.lines) if line.startswith("harness "))
    assert run.lines[header].split()[:6] == ["harness", "passed", "calls", "exact", "spliced", "rollout"]
    table = [line for line in run.lines[header + 1:-1] if not line.startswith(" ")]
    assert [line.split()[0] for line in table] == summary["harnesses"]
    for line in table:
        name, passed = line.split()[:2]
        assert passed == ("yes" if name in HARNESSES else "no"), line
        if name in HARNESSES:
            assert line.split()[2:6] == ["3", "3", f"{rows[name]['spliced_calls']}/2", "COMPLETE"], line
        else:
            assert NOT_YET[name][:40] in line, line
    assert sum("prefix break, call" in line for line in run.lines) == sum(
        len(r.get("break_causes", [])) for r in rows.values())


def test_an_unknown_harness_is_reported_not_passing_and_the_check_exits_1(
        harness_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No gateway is contacted for it: the URL points nowhere.
    assert main(["harnesses", "check", "--only", "nope", "--gateway", "http://127.0.0.1:9"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["harnesses"] == ["nope", *NOT_YET] and summary["harnesses_passed"] == []
    assert summary["per_harness"]["nope"]["reason"] == "unknown harness"
    assert summary["calls"] == summary["token_exact_calls"] == 0 and summary["spliced_fraction"] == 0.0
    assert lines[0].split()[:3] == ["harness", "passed", "calls"]
    assert lines[1].startswith("nope") and " no " in lines[1]
