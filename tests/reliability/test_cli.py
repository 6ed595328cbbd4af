"""`tokentrail reliability` wiring: every part can be left out by name, and the last line is the JSON summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reliability import cli

pytestmark = pytest.mark.e2e


def test_every_part_can_be_skipped_and_the_summary_is_the_last_line(
        kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skips = [arg for part in ("corpus", *cli.FAULTS) for arg in ("--skip", part)]
    assert {"cluster", "chaos", "restart", "poison", "feedback", "sessions", "costly"} <= set(cli.FAULTS)
    assert cli.main(["--quick", *skips, "--workdir", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["faults"], summary["lost"], summary["duplicated"], summary["mode"]) == (0, 0, 0, "quick")
