"""Late and unmatched feedback as dead letters that point at the feedback's place on tokentrail.feedback.

The records are built by the pure join (``late_dead_letter``, ``unmatched_dead_letter``); this only
encodes them and places them like any other output (keyed by the feedback's target id)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from processors.dead_letters import dead_letter
from processors.feedback.join import STAGE, LateFeedback, UnmatchedFeedback, late_dead_letter, unmatched_dead_letter
from processors.stream.feedback.messages import Source, as_record
from processors.stream.outputs import Encoded
from processors.stream.topics import StreamTopics
from schemas.codec import Codec

Record = dict[str, Any]


class FeedbackLetters:
    def __init__(self, codec: Codec, topics: StreamTopics, stats: Counter[str]) -> None:
        self.codec = codec
        self.topics = topics
        self.stats = stats

    def _copy(self, feedback: Record) -> bytes:
        """The letter's copy of the feedback, sealed as the join carried it."""
        return self.codec.encode("Feedback", as_record(feedback))

    def _encoded(self, record: Record, feedback: Record) -> Encoded:
        # The letter copies the feedback (its text is content): it belongs to the feedback's subject.
        record = dict(record, subject=feedback.get("subject"))
        return (self.topics.dead_letter, feedback["target_id"].encode(), self.codec.encode("DeadLetter", record))

    def unmatched(self, unmatched: UnmatchedFeedback, feedback: Record, source: Source) -> Encoded:
        key = feedback["target_id"].encode()
        record = unmatched_dead_letter(unmatched, source_topic=source.topic, partition=source.partition,
                                       offset=source.offset, key=key, value=self._copy(feedback),
                                       created_at_us=int(feedback["created_at_us"]))
        self.stats["feedback.unmatched"] += 1
        return self._encoded(record, feedback)

    def late(self, late: LateFeedback, rollout_id: str, feedback: Record, source: Source) -> Encoded:
        key = feedback["target_id"].encode()
        record = late_dead_letter(late, rollout_id=rollout_id, source_topic=source.topic, partition=source.partition,
                                  offset=source.offset, key=key, value=self._copy(feedback),
                                  created_at_us=int(feedback["created_at_us"]))
        self.stats["feedback.late"] += 1
        return self._encoded(record, feedback)

    def overflow(self, feedback: Record, source: Source, reason: str, stage: str = STAGE) -> Encoded:
        """Feedback shed from a key's state to keep it within its budget (``StateOverflow``), by the join or the
        resolver (``stage``): the letter points at the feedback on tokentrail.feedback, as if it had been
        refused when it arrived."""
        record = dead_letter(stage=stage, source_topic=source.topic, partition=source.partition, offset=source.offset,
                             key=feedback["target_id"].encode(), value=self._copy(feedback),
                             error=reason, error_type="StateOverflow", created_at_us=int(feedback["created_at_us"]))
        return self._encoded(record, feedback)
