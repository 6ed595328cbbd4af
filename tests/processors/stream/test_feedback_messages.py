"""The feedback join's internal messages: what a call indexes, how feedback is keyed, round trips, and a
clear error for anything else on those topics."""

from __future__ import annotations

import pytest

from processors.errors import InvalidEvent
from processors.feedback.join import RolloutRef
from processors.stream.feedback.messages import (
    Source,
    feedback_message,
    index_messages,
    read_message,
    rollout_message,
    target_message_key,
)
from schemas.feedback import FeedbackValue, build_feedback


def make(target_kind: str, target_id: str) -> dict:
    return build_feedback(source="ui", target_kind=target_kind, target_id=target_id, kind="BINARY",
                          value=FeedbackValue(binary=True), event_time_us=10, created_at_us=11)


def test_a_call_indexes_its_call_id_and_session_id_under_its_rollout() -> None:
    call = {"event_id": "c1", "rollout_id": "r1", "session_id": "s1", "timings": {"received_at_us": 5}}
    keys = [key for key, _ in index_messages(call)]
    assert keys == ["call:c1", "session:s1"]
    assert read_message(index_messages(call)[0][1], "t") == {"type": "index", "rollout_id": "r1", "event_us": 5}
    assert [k for k, _ in index_messages(dict(call, session_id=None))] == ["call:c1"]


def test_feedback_is_keyed_by_the_call_or_session_it_names_and_round_trips() -> None:
    assert target_message_key(make("RESPONSE", "chatcmpl-c9")) == "call:c9"
    assert target_message_key(make("CALL", "c9")) == "call:c9"
    assert target_message_key(make("SESSION", "s9")) == "session:s9"
    assert target_message_key(make("ROLLOUT", "r9")) is None  # no lookup: keyed by the rollout id itself
    item = make("SESSION", "s9")
    back = read_message(feedback_message(item, Source("tokentrail.feedback", 2, 40), "session"), "t")
    assert back == {"type": "feedback", "feedback": item, "source": Source("tokentrail.feedback", 2, 40),
                    "via": "session"}
    ref = RolloutRef("ev", "r1", "a1", 7, ("c1", "c2"), ("s1",), "g")
    assert read_message(rollout_message(ref), "t") == {"type": "rollout", "ref": ref}


@pytest.mark.parametrize("value", [b"\x00garbage", b"[1, 2]", b'{"type": "other"}'])
def test_anything_else_is_refused_naming_the_topic(value: bytes) -> None:
    with pytest.raises(InvalidEvent, match=r"not a feedback-join message on tokentrail\.feedback-by-target"):
        read_message(value, "tokentrail.feedback-by-target")
