"""DeadLetter records: an input the stage could not process, kept with the reason, never dropped."""

from __future__ import annotations

from typing import Any

from schemas.codec import Codec, DecodeError
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


def subject_of(codec: Codec, value: bytes | None) -> str | None:
    """The subject of a dead-lettered input, when it can be read (the field is never sealed; nothing is
    opened): the letter names it, so it is sealed under the subject's key and forgetting the subject blanks
    its copy in ClickHouse. None for an input that cannot be decoded or has no subject."""
    if not value:
        return None
    try:
        _name, record = codec.decode(value, open_sealed=False)
    except (DecodeError, ValueError):
        return None
    subject = record.get("subject")
    return subject if isinstance(subject, str) and subject else None
