"""The feedback join's parts in the processors app, built only when ``processors.feedback_join`` is on.

  feedback-router    tokentrail.feedback -> feedback-by-target | feedback-by-rollout   (router.py)
  (assembler, after) tokentrail.calls: call and session ids -> feedback-by-target
  (router, after)    tokentrail.rollouts: COMPLETE rollouts -> feedback-by-rollout
  feedback-resolver  feedback-by-target -> feedback-by-rollout, table feedback-targets (resolver.py)
  feedback-join      feedback-by-rollout -> rewards, dead letters, table feedback-join  (agent.py)

Each agent has concurrency 1 and a lock its timer shares, like the assembler and the grouper.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import faust

from processors.stream.feedback.agent import FeedbackJoinAgent
from processors.stream.feedback.letters import FeedbackLetters
from processors.stream.feedback.resolver import FeedbackResolver
from processors.stream.feedback.router import FeedbackRouter
from processors.stream.health import WorkerHealth
from processors.stream.outputs import RAW_TOPIC, Outputs
from processors.stream.tables import RAW_TABLE
from processors.stream.worker_config import StreamConfig
from schemas.codec import Codec

Handler = Callable[[Any], Awaitable[None]]


class FeedbackParts:
    def __init__(self, cfg: StreamConfig, app: faust.App, codec: Codec, outputs: Outputs, health: WorkerHealth,
                 stats: Counter[str], table_topic: dict[str, str]) -> None:
        assert cfg.feedback is not None
        self.app = app
        self.topics = topics = cfg.topics
        self.health = health
        self.tick_s = cfg.tick_s
        partitions = cfg.kafka.partitions
        self.targets = app.Table("feedback-targets", **RAW_TABLE, partitions=partitions,
                                 extra_topic_configs=table_topic,
                                 help="rollout ids and waiting feedback per id feedback names (call:, session:)")
        self.joins = app.Table("feedback-join", **RAW_TABLE, partitions=partitions, extra_topic_configs=table_topic,
                               help="FeedbackJoin snapshot per rollout id, with the feedback it still holds")
        letters = FeedbackLetters(codec, topics, stats)
        self.router = FeedbackRouter(topics, codec, outputs, letters, stats)
        self.resolver = FeedbackResolver(cfg.feedback, app, self.targets, topics, outputs, letters, health, stats)
        self.join = FeedbackJoinAgent(cfg.feedback, app, self.joins, topics, outputs, letters, health, stats)
        # Input topic -> the lock its agent holds while busy (the watchdog's view; feedback itself is stateless).
        self.busy = {topics.feedback_by_target: self.resolver.lock, topics.feedback_by_rollout: self.join.lock}
        self.inputs = {topics.feedback, *self.busy}

    def after_assembler(self, assemble: Handler) -> Handler:
        calls = self.topics.calls

        @functools.wraps(assemble)
        async def assemble_and_index(message: Any) -> None:
            await assemble(message)
            if message.topic == calls:
                await self.router.index_call(message)

        return assemble_and_index

    def after_router(self, route: Handler) -> Handler:
        @functools.wraps(route)
        async def route_and_forward(message: Any) -> None:
            await route(message)
            await self.router.forward_rollout(message)

        return route_and_forward

    def register(self, stream_of: Callable[[Handler], Handler]) -> None:
        app, topics, guarded = self.app, self.topics, self.health.guarded
        app.agent(app.topic(topics.feedback, **RAW_TOPIC), name="feedback-router", concurrency=1)(
            stream_of(self.router.route_feedback))
        app.agent(app.topic(topics.feedback_by_target, **RAW_TOPIC), name="feedback-resolver", concurrency=1)(
            stream_of(self.resolver.resolve))
        app.agent(app.topic(topics.feedback_by_rollout, **RAW_TOPIC), name="feedback-join", concurrency=1)(
            stream_of(self.join.join))
        app.timer(self.tick_s, name="feedback-resolver-timer")(guarded(self.resolver.tick))
        app.timer(self.tick_s, name="feedback-join-timer")(guarded(self.join.tick))
