"""The baselines' parts in the processors app, built only when ``processors.baselines`` is on.

  (assembler, after) tokentrail.calls: an attempt's first call -> its cluster key -> baseline-by-rollout
  (router, after)    tokentrail.rollouts: complete, counted rollouts           -> baseline-by-rollout
  baseline-rewards   tokentrail.rewards: feedback rewards the baselines read    -> baseline-by-rollout
  baseline-pair      baseline-by-rollout -> baseline-by-key, table baseline-pairs  (pair.py)
  baseline           baseline-by-key -> baselines, rewards, credits, samples, table baseline-keys
                                                                                  (agent.py)

Each agent has concurrency 1 and a lock its timer shares, like the other stateful agents.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import faust

from processors.baselines.members import first_call_key, is_baseline_input
from processors.stream.baselines.agent import BaselineKeys
from processors.stream.baselines.messages import ROLLOUT, first_message, reward_message, tagged
from processors.stream.baselines.pair import BaselinePairs
from processors.stream.health import WorkerHealth
from processors.stream.outputs import BAD_INPUT, RAW_TOPIC, Outputs
from processors.stream.tables import RAW_TABLE
from processors.stream.worker_config import StreamConfig
from schemas.codec import Codec, DecodeError

Handler = Callable[[Any], Awaitable[None]]
DAY_US = 86_400 * 1_000_000


class BaselineParts:
    def __init__(self, cfg: StreamConfig, app: faust.App, codec: Codec, outputs: Outputs, health: WorkerHealth,
                 stats: Counter[str], table_topic: dict[str, str]) -> None:
        assert cfg.baselines is not None
        self.cfg = cfg.baselines
        self.app = app
        self.codec = codec
        self.outputs = outputs
        self.health = health
        self.stats = stats
        self.topics = topics = cfg.topics
        self.tick_s = cfg.tick_s
        partitions = cfg.kafka.partitions
        self.pair_table = app.Table("baseline-pairs", **RAW_TABLE, partitions=partitions,
                                    extra_topic_configs=table_topic,
                                    help="completed attempts, first-call keys and feedback rewards per rollout id")
        self.key_table = app.Table("baseline-keys", **RAW_TABLE, partitions=partitions, extra_topic_configs=table_topic,
                                   help="KeyBaselines snapshot per grouping key, with the members it holds")
        # A completed attempt waits for its feedback reward: the feedback window, its lag, and a day to spare.
        feedback = cfg.feedback
        wait_us = (feedback.window_us + feedback.lag_us if feedback is not None else DAY_US) + DAY_US
        self.pairs = BaselinePairs(self.cfg, app, self.pair_table, topics, codec, outputs, health, stats, wait_us)
        self.keys = BaselineKeys(self.cfg, cfg.stages.credit, cfg.stages.sample, app, self.key_table, topics, codec,
                                 outputs, health, stats)
        self.busy = {topics.baseline_by_rollout: self.pairs.lock, topics.baseline_by_key: self.keys.lock}
        self.inputs = {topics.rewards, *self.busy}

    def after_assembler(self, assemble: Handler) -> Handler:
        calls, by_rollout = self.topics.calls, self.topics.baseline_by_rollout
        wanted = self.cfg.key.by == "first_user_message"

        @functools.wraps(assemble)
        async def assemble_and_key(message: Any) -> None:
            await assemble(message)
            if not wanted or message.topic != calls:
                return
            try:
                _, call = self.codec.decode(message.value, expect="CallRecord")
            except DecodeError:
                return  # the assembler dead-letters it
            if call["call_index"] == 0:
                await self.outputs.send([(by_rollout, call["rollout_id"].encode(),
                                          first_message(call["attempt_id"], first_call_key(call, self.cfg),
                                                        int(call["timings"]["received_at_us"])))])

        return assemble_and_key

    def after_router(self, route: Handler) -> Handler:
        by_rollout = self.topics.baseline_by_rollout

        @functools.wraps(route)
        async def route_and_pair(message: Any) -> None:
            await route(message)
            try:
                _, rollout = self.codec.decode(message.value, expect="CompletedRollout")
            except DecodeError:
                return  # the group router dead-letters it
            if rollout["status"] == "COMPLETE" and rollout["counted"]:
                await self.outputs.send([(by_rollout, rollout["rollout_id"].encode(), tagged(ROLLOUT, message.value))])

        return route_and_pair

    async def forward_reward(self, message: Any) -> None:
        """tokentrail.rewards: the feedback rewards the baselines read, to their rollout's pairing entry."""
        self.stats["in.baseline_rewards"] += 1
        try:
            _, reward = self.codec.decode(message.value, expect="Reward", topic=message.topic,
                                          partition=message.partition, offset=message.offset)
        except BAD_INPUT as exc:
            await self.outputs.dead_letter("baseline_rewards", message, exc)
            return
        if is_baseline_input(reward, self.cfg):
            await self.outputs.send([(self.topics.baseline_by_rollout, reward["rollout_id"].encode(),
                                      reward_message(reward))])

    def register(self, stream_of: Callable[[Handler], Handler]) -> None:
        app, topics, guarded = self.app, self.topics, self.health.guarded
        app.agent(app.topic(topics.rewards, **RAW_TOPIC), name="baseline-rewards", concurrency=1)(
            stream_of(self.forward_reward))
        app.agent(app.topic(topics.baseline_by_rollout, **RAW_TOPIC), name="baseline-pair", concurrency=1)(
            stream_of(self.pairs.pair))
        app.agent(app.topic(topics.baseline_by_key, **RAW_TOPIC), name="baseline", concurrency=1)(
            stream_of(self.keys.measure))
        app.timer(self.tick_s, name="baseline-pair-timer")(guarded(self.pairs.tick))
        app.timer(self.tick_s, name="baseline-timer")(guarded(self.keys.tick))
