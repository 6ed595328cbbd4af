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
    old = [p for p in FIXTURE_DIR.glob(f"{name}-*.bin") if not p.name.endswith(f"{current}.bin")]
    assert old, f"no fixture of an older {name} schema"
    for path in old:
        _, record = codec.decode(path.read_bytes(), expect=name)
        assert record["subject"] is None and record["sealed"] is None, path.name
    # The current fixture has every optional field filled: the subject is read back, not defaulted.
    _, record = codec.decode((FIXTURE_DIR / f"{name}-{current}.bin").read_bytes(), expect=name)
    assert record["subject"] == "example"
