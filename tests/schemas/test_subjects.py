"""Records written before subjects existed read as "no subject" (issue 31 item 1), from the committed
fixtures of every older writer schema of the records that carry content."""

from __future__ import annotations

import pytest

from schemas.codec import get_codec
from schemas.fixtures import FIXTURE_DIR

SUBJECT_RECORDS = ("CallRecord", "AttemptStarted", "EnvStep", "AttemptFinished", "CompletedRollout", "Sample",
                   "Feedback", "DeadLetter")


@pytest.mark.parametrize("name", SUBJECT_RECORDS)
def test_old_records_read_as_no_subject(name: str) -> None:
    codec = get_codec()
    current = codec.store.schema(name).fingerprint.hex()
    by_fingerprint = codec.store.by_fingerprint
    fixtures = sorted(FIXTURE_DIR.glob(f"{name}-*.bin"))
    with_subject = [p for p in fixtures if _has_subject(by_fingerprint[bytes.fromhex(p.stem.split("-")[1])].raw)]
    old = [p for p in fixtures if p not in with_subject]
    assert old, f"no fixture of an older {name} schema"
    for path in old:
        _, record = codec.decode(path.read_bytes(), expect=name)
        assert record["subject"] is None and record["sealed"] is None, path.name
    # The current fixture (and those of later versions) have every optional field filled: the subject is read
    # back, not defaulted.
    assert FIXTURE_DIR / f"{name}-{current}.bin" in with_subject
    for path in with_subject:
        _, record = codec.decode(path.read_bytes(), expect=name)
        assert record["subject"] == "example", path.name


def _has_subject(writer: dict) -> bool:
    return any(f["name"] == "subject" for f in writer["fields"])
