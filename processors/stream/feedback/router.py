"""The feedback join's first step: re-key what it needs by the ids feedback names.

  calls (beside the assembler)  each call's id and session id -> tokentrail.feedback-by-target (index)
  rollouts (beside the router)  each COMPLETE rollout as a RolloutRef -> tokentrail.feedback-by-rollout
  feedback (its own agent)      checked; naming a rollout -> feedback-by-rollout; naming a call, a response
                                or a session -> feedback-by-target; naming no call -> unmatched at once;
                                undecodable or invalid -> dead letter (stage feedback_router)

Calls and rollouts are read by the agents that already consume those topics (one agent per input
topic keeps offsets in order, commits.py): the app calls ``index_call`` and ``forward_rollout`` after
them. A call or rollout the codec cannot decode is left to those agents, which dead-letter it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from processors.feedback.join import UnmatchedFeedback, rollout_ref
from processors.feedback.validate import check_feedback, check_not_ahead
from processors.stream.clock import MAX_FUTURE_SKEW_S
from processors.stream.feedback.letters import FeedbackLetters
from processors.stream.feedback.messages import (
    Source,
    feedback_message,
    for_the_join,
    index_messages,
    rollout_message,
    target_message_key,
)
from processors.stream.outputs import BAD_INPUT, Outputs
from processors.stream.topics import StreamTopics
from schemas.codec import Codec, DecodeError

STAGE = "feedback_router"


class FeedbackRouter:
    def __init__(self, topics: StreamTopics, codec: Codec, outputs: Outputs, letters: FeedbackLetters,
                 stats: Counter[str]) -> None:
        self.topics = topics
        self.codec = codec
        self.outputs = outputs
        self.letters = letters
        self.stats = stats

    async def index_call(self, message: Any) -> None:
        try:
            _, call = self.codec.decode(message.value, expect="CallRecord")
        except DecodeError:
            return  # the assembler dead-letters it
        await self.outputs.send([(self.topics.feedback_by_target, key.encode(), value)
                                 for key, value in index_messages(call)])

    async def forward_rollout(self, message: Any) -> None:
        try:
            _, rollout = self.codec.decode(message.value, expect="CompletedRollout")
        except DecodeError:
            return  # the group router dead-letters it
        if rollout["status"] != "COMPLETE":
            return
        ref = rollout_ref(rollout)
        await self.outputs.send([(self.topics.feedback_by_rollout, ref.rollout_id.encode(), rollout_message(ref))])

    async def route_feedback(self, message: Any) -> None:
        self.stats["in.feedback"] += 1
        try:
            _, feedback = self.codec.decode(message.value, expect="Feedback", topic=message.topic,
                                            partition=message.partition, offset=message.offset)
            check_feedback(feedback)
            check_not_ahead(feedback, round(message.timestamp * 1e6), round(MAX_FUTURE_SKEW_S * 1e6))
        except BAD_INPUT as exc:
            await self.outputs.dead_letter(STAGE, message, exc)
            return
        feedback = for_the_join(self.codec, feedback)  # checked opened; carried on sealed
        source = Source(message.topic, message.partition, message.offset)
        if feedback["target_kind"] == "ROLLOUT":
            await self.outputs.send([(self.topics.feedback_by_rollout, feedback["target_id"].encode(),
                                      feedback_message(feedback, source))])
            return
        key = target_message_key(feedback)
        if key is None:  # a response or call target without a call id: nothing can ever match it
            reason = (f"{feedback['target_kind']} target {feedback['target_id']!r} names no call (a response id "
                      "this gateway did not return?)")
            await self.outputs.send([self.letters.unmatched(UnmatchedFeedback(feedback["event_id"], reason),
                                                            feedback, source)])
            return
        await self.outputs.send([(self.topics.feedback_by_target, key.encode(), feedback_message(feedback, source))])
