"""Feedback read from Kafka is taken only as build_feedback would make it: every kind's valid value
passes; a value outside its kind's rules, a call id its target does not name, or an id that is not the
hash of the content is refused with the reason."""

from __future__ import annotations

import pytest

from processors.errors import InvalidEvent
from processors.feedback.validate import check_feedback

from .scenarios import VALUES, feedback


@pytest.mark.parametrize("kind", sorted(VALUES))
def test_feedback_built_by_the_builder_passes(kind: str) -> None:
    for n in range(4):
        check_feedback(feedback("RESPONSE", "chatcmpl-c1", kind, 1.0, n=n))
        check_feedback(feedback("SESSION", "s1", kind, 1.0, n=n))


@pytest.mark.parametrize(("change", "reason"), [
    ({"rating": 7.0}, "outside its scale"),
    ({"binary": True}, "binary belongs to BINARY feedback"),
    ({"call_id": "c2"}, "is not the call its target names"),
    ({"source_feedback_id": "another"}, "not the hash of its content"),
    ({"details_json": "{not json"}, "unreadable"),
])
def test_feedback_changed_after_it_was_built_is_refused_with_the_reason(change: dict, reason: str) -> None:
    record = dict(feedback("CALL", "c1", "RATING", 1.0, n=1), **change)
    with pytest.raises(InvalidEvent, match=reason):
        check_feedback(record)
