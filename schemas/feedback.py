"""Building a Feedback event (schemas/feedback.avsc): validation, its deterministic id, response ids.

The one place that knows a whole Feedback record, so the gateway's ``POST /v1/feedback``, systems that
publish to ``tokentrail.feedback`` directly, and the tests build the same event from the same facts.
Pure: no I/O, no clock (the caller passes the arrival time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from schemas.ids import event_id

Record = dict[str, Any]

TARGET_KINDS = ("RESPONSE", "CALL", "SESSION", "ROLLOUT")
KINDS = ("BINARY", "RATING", "OUTCOME", "TASK_OUTCOME", "TEXT")
OUTCOMES = ("ACCEPTED", "EDITED", "REJECTED")
# The gateway's response ids are one of these prefixes + the call id (producers/gateway/*_adapter.py).
RESPONSE_ID_PREFIXES = ("chatcmpl-", "cmpl-", "msg_", "resp_")
MAX_ID_CHARS = 200
MAX_TEXT_CHARS = 16_000


class FeedbackError(ValueError):
    """Feedback that cannot become an event; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# A tenant's call is answered as ``<call id>.<tag>`` (producers/gateway/session_refs.py, call_ref): the tag says
# whose call it is to whoever holds the gateway's secret; the call id is the part before the separator.
CALL_REF_SEP = "."


def split_call_ref(call_ref: str) -> tuple[str, str | None]:
    """The call id and the tenant tag of a call ref (a bare call id: no tag)."""
    call_id, sep, tag = call_ref.partition(CALL_REF_SEP)
    return (call_id, tag) if sep and call_id and tag else (call_ref, None)


def call_ref_of_response(response_id: str) -> str | None:
    """The call ref inside a response id the gateway returned (``chatcmpl-<ref>``...), or None for an id it
    did not mint."""
    for prefix in RESPONSE_ID_PREFIXES:
        if response_id.startswith(prefix) and len(response_id) > len(prefix):
            return response_id[len(prefix):]
    return None


def call_id_of_response(response_id: str) -> str | None:
    """The call id inside a response id the gateway returned, or None for an id it did not mint."""
    ref = call_ref_of_response(response_id)
    return None if ref is None else split_call_ref(ref)[0]


@dataclass(frozen=True)
class FeedbackValue:
    """What the feedback says; only the fields its kind uses may be set."""

    binary: bool | None = None
    rating: float | None = None
    rating_min: float = 0.0
    rating_max: float = 1.0
    outcome: str | None = None
    edit_distance: float | None = None
    task_success: bool | None = None
    details: Any = None
    text: str | None = None


def _require(condition: bool, message: str, param: str) -> None:
    if not condition:
        raise FeedbackError(message, param)


def _check_id(value: str, param: str) -> None:
    _require(isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS,
             f"{param} must be a non-empty string of at most {MAX_ID_CHARS} characters", param)


def _finite(value: float | None, param: str) -> None:
    _require(value is None or (isinstance(value, int | float) and math.isfinite(value)),
             f"{param} must be a finite number", param)


def _check_value(kind: str, v: FeedbackValue) -> None:
    for param in ("rating", "rating_min", "rating_max", "edit_distance"):
        _finite(getattr(v, param), param)
    if kind == "BINARY":
        _require(v.binary is not None, "BINARY feedback needs binary (true or false)", "binary")
    elif kind == "RATING":
        _require(v.rating is not None, "RATING feedback needs rating", "rating")
        _require(v.rating_min < v.rating_max, "rating_min must be below rating_max", "rating_min")
        assert v.rating is not None
        _require(v.rating_min <= v.rating <= v.rating_max,
                 f"rating {v.rating} is outside its scale [{v.rating_min}, {v.rating_max}]", "rating")
    elif kind == "OUTCOME":
        _require(v.outcome in OUTCOMES, f"OUTCOME feedback needs outcome, one of {', '.join(OUTCOMES)}",
                 "outcome")
        if v.outcome == "EDITED":
            _require(v.edit_distance is not None, "an EDITED outcome needs edit_distance (0 to 1)",
                     "edit_distance")
    elif kind == "TASK_OUTCOME":
        _require(v.task_success is not None, "TASK_OUTCOME feedback needs task_success", "task_success")
    elif kind == "TEXT":
        _require(bool(v.text), "TEXT feedback needs text", "text")
    _require(v.edit_distance is None or 0.0 <= v.edit_distance <= 1.0, "edit_distance must be between 0 and 1",
             "edit_distance")
    _require(v.edit_distance is None or v.outcome == "EDITED", "edit_distance belongs to an EDITED outcome",
             "edit_distance")
    _require(v.text is None or len(v.text) <= MAX_TEXT_CHARS, f"text is over {MAX_TEXT_CHARS} characters", "text")
    for param, used_by in (("binary", "BINARY"), ("rating", "RATING"), ("outcome", "OUTCOME"),
                           ("task_success", "TASK_OUTCOME")):
        _require(getattr(v, param) is None or kind == used_by, f"{param} belongs to {used_by} feedback", param)


def build_feedback(*, source: str, target_kind: str, target_id: str, kind: str, value: FeedbackValue,
                   event_time_us: int, created_at_us: int, source_feedback_id: str | None = None,
                   supersedes: str | None = None) -> Record:
    """A validated Feedback record; raises FeedbackError naming the field that is wrong.

    The id hashes what the feedback says and when it happened, not when it arrived, so a retried
    delivery of the same feedback has the same id and the sinks keep it once."""
    _check_id(source, "source")
    _require(target_kind in TARGET_KINDS, f"target kind must be one of {', '.join(TARGET_KINDS)}", "target")
    _check_id(target_id, "target")
    _require(kind in KINDS, f"kind must be one of {', '.join(KINDS)}", "kind")
    for param, optional in (("source_feedback_id", source_feedback_id), ("supersedes", supersedes)):
        if optional is not None:
            _check_id(optional, param)
    _require(isinstance(event_time_us, int) and event_time_us > 0, "event time must be a positive time",
             "event_time")
    _check_value(kind, value)
    call_id: str | None = None
    if target_kind == "RESPONSE":
        call_id = call_id_of_response(target_id)
        _require(call_id is not None, f"response id {target_id!r} was not returned by this gateway (it starts "
                 f"with one of {', '.join(RESPONSE_ID_PREFIXES)})", "target")
    elif target_kind == "CALL":
        call_id = split_call_ref(target_id)[0]
    try:
        details_json = orjson.dumps({} if value.details is None else value.details,
                                    option=orjson.OPT_SORT_KEYS).decode()
    except TypeError as exc:
        raise FeedbackError(f"details cannot be stored as JSON: {exc}", "details") from exc
    record: Record = {
        "event_id": "", "source": source, "source_feedback_id": source_feedback_id,
        "target_kind": target_kind, "target_id": target_id, "call_id": call_id, "kind": kind,
        "binary": value.binary, "rating": None if value.rating is None else float(value.rating),
        "rating_min": float(value.rating_min), "rating_max": float(value.rating_max), "outcome": value.outcome,
        "edit_distance": None if value.edit_distance is None else float(value.edit_distance),
        "task_success": value.task_success, "details_json": details_json, "text": value.text,
        "supersedes": supersedes, "event_time_us": int(event_time_us), "created_at_us": int(created_at_us),
    }
    record["event_id"] = feedback_id(record)
    return record


def feedback_id(record: Record) -> str:
    """Hash of everything in a Feedback but its id and arrival time."""
    defining = {k: v for k, v in record.items() if k not in ("event_id", "created_at_us")}
    return event_id("feedback", defining)
