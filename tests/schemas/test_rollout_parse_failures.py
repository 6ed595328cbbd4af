"""Rollouts assembled before the parse outcome was carried (CompletedRollout v1-v5) read with every call's
``parse_failures`` null, "not known", from the committed fixtures of every older writer schema; the current
fixture reads its value back (issue 28: the parse-failure sample policy)."""

from __future__ import annotations

from schemas.codec import get_codec
from schemas.fixtures import FIXTURE_DIR


def test_old_rollouts_read_their_calls_parse_failures_as_not_known() -> None:
    codec = get_codec()
    current = codec.store.schema("CompletedRollout").fingerprint.hex()
    old = [p for p in FIXTURE_DIR.glob("CompletedRollout-*.bin") if not p.name.endswith(f"{current}.bin")]
    assert len(old) >= 5, "a fixture of every older CompletedRollout schema"
    for path in old:
        _, record = codec.decode(path.read_bytes(), expect="CompletedRollout")
        assert record["calls"] and all(c["parse_failures"] is None for c in record["calls"]), path.name
    _, record = codec.decode((FIXTURE_DIR / f"CompletedRollout-{current}.bin").read_bytes(), expect="CompletedRollout")
    assert [c["parse_failures"] for c in record["calls"]] == [7]
