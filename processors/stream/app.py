"""The faust-streaming application: the pure stage core running on the real topics.

Three agents, each with concurrency 1 (faust-streaming issue 606: with more, offsets can be committed
past a message still in flight):

  assembler  tokentrail.calls + tokentrail.env -> tokentrail.rollouts           (assembler_agent.py)
             faust has no stream-stream join (Join.process is unimplemented), so one agent consumes
             both topics. They are keyed by rollout id with the same partition count, hence
             co-partitioned; the join state is a table keyed by rollout id holding
             ``RolloutAssembly.to_bytes()``. A timer expires attempts idle for
             settings.processors.attempt_timeout_s (INCOMPLETE rollouts) and forgets old state.
  router     tokentrail.rollouts -> tokentrail.rollouts-by-group (internal)     (grouper_agent.py)
             complete, counted rollouts re-keyed by group id, so one worker sees a whole group.
  grouper    tokentrail.rollouts-by-group -> groups, scores, rewards, credits, samples
             group slots in a table keyed by group id, member rollouts in a second table (so a slot
             stays small); a closed group (FULL, PARTIAL by the timer, or LATE) runs
             ``process_group`` in an executor thread (verifiers may block or run subprocesses).

Delivery: ``processing_guarantee="at_least_once"``. Every output carries a deterministic event id,
so re-processing after a crash re-emits identical events that every consumer deduplicates. What makes
re-delivery complete as well as idempotent is the order of effects for each input:

  1. outputs are produced and their acknowledgements (acks=all) awaited,
  2. then the new state is written to the table's changelog and that write awaited,
  3. only then the input counts as processed (faust commits its offset later).

A kill -9 can cut this anywhere. Cut before 2: the state is the old one, the input is re-delivered and
re-emits the same outputs. Cut after 2: the state says "emitted" (an emitted attempt, a group member
already in a closed group) and the outputs are known to be on Kafka, so the re-delivered input is
skipped. The state is the full value for its key, so a later changelog write covers a lost earlier one.
The timers follow the same order. Every table is a memory store restored from its changelog topic
(tables.py).

Known limits: a timer that closes a group (PARTIAL) or expires an attempt and is cut between its
outputs and its state write may, after the restart, decide again with more input present (a FULL group
after a PARTIAL one, an INCOMPLETE rollout with more events); both records keep their own ids. The
assembler rewrites a rollout's whole state per event, so changelog bytes grow with calls² per rollout.

Each input partition is processed strictly in offset order from its committed offset, and the worker
commits input offsets itself, exactly where each agent stopped (commits.py).

Bad input never stops a worker: DecodeError, InvalidEvent, ConflictingEvent and any other
ProcessorError become a DeadLetter on tokentrail.dead-letter with the reason (outputs.py). Anything
else (a Kafka failure, a bug) crashes the worker, which restarts from the committed offsets
(health.py). A watchdog stops a worker whose input waits with no progress for ``stall_timeout_s``
(exit code 3) for its supervisor to restart; ``kill -USR1 <pid>`` logs what each asyncio task of a
running worker is waiting on (watchdog.py).

This module builds the faust app, its tables, and wires the agents, timers and tasks of the parts.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import faust

from processors.stream.assembler_agent import AssemblerAgent
from processors.stream.baselines.wiring import BaselineParts
from processors.stream.commits import COMMIT_EVERY_S, InputOffsets
from processors.stream.feedback.wiring import FeedbackParts
from processors.stream.grouper_agent import GrouperAgent, Router
from processors.stream.health import WorkerHealth
from processors.stream.outputs import RAW_TOPIC, Outputs
from processors.stream.tables import RAW_TABLE
from processors.stream.watchdog import StalledError, Watchdog
from processors.stream.worker_config import StreamConfig
from schemas.kafka.config import faust_app_settings
from schemas.kafka.registry_framing import kafka_codec

__all__ = ["ProcessorsApp", "StalledError", "build_app"]

log = logging.getLogger("tokentrail.processors")

# Room for the table entry header and framing on top of the largest record.
SIZE_SLACK = 64 * 1024
# How often the progress line is logged (when something changed).
PROGRESS_EVERY_S = 10.0


class ProcessorsApp:
    """Builds the faust app, its tables, agents and timers for one StreamConfig."""

    def __init__(self, cfg: StreamConfig) -> None:
        self.cfg = cfg
        kafka, proc = cfg.kafka, cfg.processors
        self.codec = kafka_codec(kafka.schema_registry_url)
        self.topics = cfg.topics
        self.stats: Counter[str] = Counter()
        self._last_stats: dict[str, int] = {}

        max_bytes = kafka.max_message_bytes + SIZE_SLACK
        options = {**faust_app_settings(kafka), "producer_max_request_size": max_bytes,
                   "consumer_max_fetch_size": max_bytes}
        self.app = faust.App(
            cfg.app_id,
            **options,
            store="memory://",
            processing_guarantee="at_least_once",
            web_enabled=False,
            autodiscover=False,
            datadir=str(proc.state_dir / cfg.app_id),
            # Standby copies would be restored behind our back; the memory store rebuilds from the
            # changelog when a partition arrives.
            table_standby_replicas=0,
            broker_session_timeout=cfg.session_timeout_s,
            broker_heartbeat_interval=max(cfg.session_timeout_s / 4, 0.5),
            stream_buffer_maxsize=256,
            consumer_group_instance_id=cfg.instance_id,
        )
        n_partitions = kafka.partitions
        table_topic = {"max.message.bytes": str(max_bytes), "compression.type": kafka.compression}
        self.assembly = self.app.Table("assembly", **RAW_TABLE, partitions=n_partitions,
                                       extra_topic_configs=table_topic,
                                       help="RolloutAssembly per rollout id (open attempts, emitted markers)")
        self.slots = self.app.Table("group-slots", **RAW_TABLE, partitions=n_partitions,
                                    extra_topic_configs=table_topic,
                                    help="GroupSlot per group id, with the rollouts already emitted")
        self.members = self.app.Table("group-members", **RAW_TABLE, partitions=n_partitions,
                                      extra_topic_configs=table_topic,
                                      help="encoded member rollouts of open groups, by group id + event id")

        # The parts: each holds its own state; the counters are shared.
        self.health = WorkerHealth(self.app)
        partitions = {spec.name: spec.partition_count(kafka) for spec in cfg.topics.specs()}
        self.outputs = Outputs(self.app, self.codec, self.topics, partitions, n_partitions, self.stats,
                               max_record_bytes=cfg.kafka.max_message_bytes - 512)
        self.assembler = AssemblerAgent(cfg, self.app, self.assembly, self.codec, self.outputs, self.health,
                                        self.stats)
        self.router = Router(cfg, self.codec, self.outputs, self.stats)
        self.grouper = GrouperAgent(cfg, self.app, self.slots, self.members, self.codec, self.outputs,
                                    self.health, self.stats)
        # The feedback join (off unless settings.processors.feedback_join): feedback/wiring.py.
        self.feedback = (FeedbackParts(cfg, self.app, self.codec, self.outputs, self.health, self.stats,
                                       table_topic) if cfg.feedback is not None else None)
        # Baselines without siblings (off unless settings.processors.baselines): baselines/wiring.py.
        self.baselines = (BaselineParts(cfg, self.app, self.codec, self.outputs, self.health, self.stats, table_topic)
                          if cfg.baselines is not None else None)
        inputs = {self.topics.calls, self.topics.env, self.topics.rollouts, self.topics.by_group}
        busy = {self.topics.calls: self.assembler.lock, self.topics.env: self.assembler.lock,
                self.topics.by_group: self.grouper.lock}
        if self.feedback is not None:
            inputs |= self.feedback.inputs
            busy.update(self.feedback.busy)
        if self.baselines is not None:
            inputs |= self.baselines.inputs
            busy.update(self.baselines.busy)
        self.offsets = InputOffsets(self.app, inputs, self.health, self.stats)
        self.watchdog = Watchdog(self.app, self.offsets, self.health, self.stats, cfg.stall_timeout_s, busy)

        app, guarded = self.app, self.health.guarded
        assembler_inputs = app.topic(self.topics.calls, self.topics.env, **RAW_TOPIC)
        assemble, route = self.assembler.assemble, self.router.route
        if self.feedback is not None:  # calls and rollouts feed the join too, after their own agent
            assemble, route = self.feedback.after_assembler(assemble), self.feedback.after_router(route)
        if self.baselines is not None:  # calls and rollouts feed the baselines' pairing too
            assemble, route = self.baselines.after_assembler(assemble), self.baselines.after_router(route)
        app.agent(assembler_inputs, name="assembler", concurrency=1)(self._stream_of(assemble))
        app.agent(app.topic(self.topics.rollouts, **RAW_TOPIC), name="router", concurrency=1)(
            self._stream_of(route))
        if self.feedback is not None:
            self.feedback.register(self._stream_of)
        if self.baselines is not None:
            self.baselines.register(self._stream_of)
        app.agent(app.topic(self.topics.by_group, **RAW_TOPIC), name="grouper", concurrency=1)(
            self._stream_of(self.grouper.group))
        app.timer(cfg.tick_s, name="assembler-timer")(guarded(self.assembler.tick))
        app.timer(cfg.tick_s, name="grouper-timer")(guarded(self.grouper.tick))
        app.timer(PROGRESS_EVERY_S, name="progress")(self._report_progress)
        app.task(self.watchdog.install_task_dump)
        app.task(self.offsets.install)
        app.on_partitions_revoked.connect(self.offsets.on_revoked)
        # faust commits only when it has new acks of its own; this commits what the agents finished.
        app.timer(COMMIT_EVERY_S, name="commit")(guarded(self.offsets.commit_tick))
        if cfg.stall_timeout_s > 0:
            app.timer(self.watchdog.every_s, name="watchdog")(guarded(self.watchdog.check))

    @property
    def crashed(self) -> BaseException | None:
        """The unexpected error that stopped the worker (a StalledError from the watchdog), if any."""
        return self.health.crashed

    def _stream_of(self, handle: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        """An agent: the input in offset order (``InputOffsets``), each message handled under the guard."""
        guarded = self.health.guarded(handle)
        offsets = self.offsets

        async def agent(stream: Any) -> None:
            async for event in stream.events():
                message = event.message
                if await offsets.in_order(message):
                    await guarded(message)
                    offsets.done(message)

        agent.__name__ = agent.__qualname__ = handle.__name__.lstrip("_")
        return agent

    async def _report_progress(self) -> None:
        current = dict(self.stats)
        if current != self._last_stats:
            log.info("progress: %s", ", ".join(f"{k}={v}" for k, v in sorted(current.items())))
            self._last_stats = current


def build_app(cfg: StreamConfig) -> ProcessorsApp:
    return ProcessorsApp(cfg)
