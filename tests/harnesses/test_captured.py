"""The captured harness requests (tests/harnesses/captured) stay readable, redacted and offline-clean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harnesses.capture import API_KEY
from tests.harnesses.capture_server import REDACTED

pytestmark = pytest.mark.e2e

CAPTURED = Path(__file__).resolve().parent / "captured"
FIXTURES = sorted(CAPTURED.glob("*.jsonl"))


def test_every_harness_and_scenario_is_captured() -> None:
    names = {p.stem for p in FIXTURES}
    for harness in ("claude", "codex", "codex-default-model", "pi", "openclaw", "openclaw-responses",
                    "openclaw-anthropic", "openclaw-local"):
        assert {harness, f"{harness}-tool"} <= names, harness
    assert {"claude-refuse", "claude-no-model", "pi-refuse", "openclaw-refuse"} <= names


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixture_is_redacted_and_answered(path: Path) -> None:
    text = path.read_text()
    assert API_KEY not in text
    records = [json.loads(line) for line in text.splitlines()]
    assert records and [r["seq"] for r in records] == list(range(len(records)))
    for record in records:
        for name in ("authorization", "x-api-key"):
            if name in record["headers"]:
                assert record["headers"][name] in (REDACTED, f"Bearer {REDACTED}")
        assert isinstance(record["body"], dict)
        # every call streams, except Claude Code's non-streaming retry after an error
        assert record["body"]["stream"] is True or (path.stem == "claude-no-model" and record["seq"] > 0)
        assert record["reply"]["status"] in (200, 400, 404)
    summary = json.loads((CAPTURED / f"{path.stem}.out.txt").read_text().splitlines()[1])
    assert summary["requests"] == len(records)
    assert summary["outside_traffic"] == [], "a harness reached for something other than the capture server"
    if path.stem.endswith("-tool"):
        assert summary["rc"] == 0 and summary["hi.txt"] == "hello"
