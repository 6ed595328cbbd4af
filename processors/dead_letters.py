"""DeadLetter records: an input the stage could not process, kept with the reason, never dropped."""

from __future__ import annotations

from typing import Any

from schemas.codec import DecodeError
from schemas.ids import event_id

Record = dict[str, Any]
MAX_REASON_CHARS = 8000


def dead_letter(*, stage: str, source_topic: str, partition: int, offset: int, key: bytes | None,
                value: bytes | None, error: BaseException | str, created_at_us: int,
                error_type: str | None = None, subject: str | None = None) -> Record:
    """A DeadLetter for the message at ``source_topic[partition]@offset``.

    The id is defined by where the message came from and the stage, so re-processing the same
    message dead-letters it under the same id. ``created_at_us`` should come from the input (the
    Kafka message timestamp), not the wall clock.
    """
    if isinstance(error, BaseException):
        kind = error_type or type(error).__name__
        reason = error.reason if isinstance(error, DecodeError) else str(error)
    else:
        kind, reason = error_type or "Error", error
    return {"event_id": event_id("dead_letter", stage, source_topic, partition, offset),
            "stage": stage, "source_topic": source_topic, "partition": int(partition), "offset": int(offset),
            "key": key, "value": value if value is not None else b"", "error_type": kind,
            "reason": reason[:MAX_REASON_CHARS], "created_at_us": int(created_at_us),
            # Whose content ``value`` carries, when the stage knows it: sealed under that subject's key.
            "subject": subject, "sealed": None}
