"""The ``Forgotten`` event (issue 31): who asked to forget which subject, when, and which keys went; never
content. Its ``request_id`` is what the audit, replay, the trainer and ``tokentrail trace`` quote."""

from __future__ import annotations

import uuid
from typing import Any

from schemas.ids import event_id

Record = dict[str, Any]


def new_request_id() -> str:
    return f"forget-{uuid.uuid4().hex[:16]}"


def forgotten_event(*, request_id: str, subject: str, requested_by: str, reason: str, key_ids: list[str],
                    requested_at_us: int, created_at_us: int) -> Record:
    return {"event_id": event_id("forgotten", request_id), "request_id": request_id, "subject": subject,
            "requested_by": requested_by, "reason": reason, "key_ids": sorted(key_ids),
            "requested_at_us": int(requested_at_us), "created_at_us": int(created_at_us)}
