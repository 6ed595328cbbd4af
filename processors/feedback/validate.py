"""Whether a Feedback record read from Kafka is one ``schemas.feedback.build_feedback`` would make.

Systems may publish to ``tokentrail.feedback`` directly; the join takes only feedback whose values
follow its kind's rules and whose id is the hash of its content (so re-deliveries are recognised).
Pure: the check rebuilds the event from the record's own fields and compares."""

from __future__ import annotations

from typing import Any

import orjson

from processors.errors import InvalidEvent
from schemas.feedback import FeedbackError, FeedbackValue, build_feedback

Record = dict[str, Any]


def check_feedback(record: Record) -> None:
    """Raise InvalidEvent naming what is wrong with a Feedback record."""
    what = f"feedback {record.get('event_id')!r}"
    try:
        details = orjson.loads(record["details_json"]) if record.get("details_json") else None
        value = FeedbackValue(binary=record["binary"], rating=record["rating"], rating_min=record["rating_min"],
                              rating_max=record["rating_max"], outcome=record["outcome"],
                              edit_distance=record["edit_distance"], task_success=record["task_success"],
                              details=details, text=record["text"])
        rebuilt = build_feedback(source=record["source"], target_kind=record["target_kind"],
                                 target_id=record["target_id"], kind=record["kind"], value=value,
                                 event_time_us=record["event_time_us"], created_at_us=record["created_at_us"],
                                 source_feedback_id=record["source_feedback_id"], supersedes=record["supersedes"])
    except FeedbackError as exc:
        raise InvalidEvent(f"{what}: {exc} (field {exc.param})") from exc
    except (KeyError, orjson.JSONDecodeError) as exc:
        raise InvalidEvent(f"{what}: unreadable ({exc!r})") from exc
    if record["call_id"] != rebuilt["call_id"]:
        raise InvalidEvent(f"{what}: call_id {record['call_id']!r} is not the call its target names "
                           f"({rebuilt['call_id']!r})")
    if record["event_id"] != rebuilt["event_id"]:
        raise InvalidEvent(f"{what}: its event id is not the hash of its content ({rebuilt['event_id']}); "
                           "build it with schemas.feedback.build_feedback")


def check_not_ahead(record: Record, arrived_us: int, max_skew_us: int) -> None:
    """Raise InvalidEvent when the feedback says it was made (``created_at_us``) further than ``max_skew_us``
    after it reached Kafka (``arrived_us``, the record's timestamp): a publisher's clock cannot be that far
    ahead, and a time from the future would steer the join (its event time counts at most its creation)."""
    ahead_us = int(record["created_at_us"]) - arrived_us
    if ahead_us > max_skew_us:
        raise InvalidEvent(f"feedback {record.get('event_id')!r}: created_at_us is {ahead_us / 1e6:,.0f} s after "
                           f"the record reached Kafka (at most {max_skew_us / 1e6:g} s of clock skew is taken)")
