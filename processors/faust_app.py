"""The faust-streaming application: the pure stage core running on the real topics.

Three agents, each with concurrency 1 (faust-streaming issue 606: with more, offsets can be committed
past a message still in flight):

  assembler  tokentrail.calls + tokentrail.env -> tokentrail.rollouts
             faust has no stream-stream join (Join.process is unimplemented), so one agent consumes
             both topics. They are keyed by rollout id with the same partition count, hence
             co-partitioned; the join state is a table keyed by rollout id holding
             ``RolloutAssembly.to_bytes()``. A timer expires attempts idle for
             settings.processors.attempt_timeout_s (INCOMPLETE rollouts) and forgets old state.
  router     tokentrail.rollouts -> tokentrail.rollouts-by-group (internal)
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
The timers follow the same order. Every table is a memory store restored from its changelog topic.

Known limits: a timer that closes a group (PARTIAL) or expires an attempt and is cut between its
outputs and its state write may, after the restart, decide again with more input present (a FULL group
after a PARTIAL one, an INCOMPLETE rollout with more events); both records keep their own ids. The
assembler rewrites a rollout's whole state per event, so changelog bytes grow with calls² per rollout.

Each input partition is processed strictly in offset order from its committed offset (``_in_order``):
in a rebalance faust drops the messages it fetched under the old generation and, where a partition has
no committed offset yet, does not seek back, so an agent would go on past them; a message ahead of the
next offset rewinds the partition to it instead. faust also acks what it drops, which would let its
commit pass unprocessed input; the worker commits input offsets itself, exactly where each agent
stopped (``_own_commits``).

Bad input never stops a worker: DecodeError, InvalidEvent, ConflictingEvent and any other
ProcessorError become a DeadLetter on tokentrail.dead-letter with the reason. Anything else (a Kafka
failure, a bug) crashes the worker, which restarts from the committed offsets. A watchdog watches the
input partitions: one whose messages wait while its idle agent gets nothing for 5 s is re-seeked to
its next offset (after a rebalance the faust/aiokafka consumer sometimes never fetches a partition that
has no committed offset yet); input that still waits after ``stall_timeout_s``, or a rebalance that does
not finish in that time, stops the worker (exit code 3) for its supervisor to restart.
``kill -USR1 <pid>`` logs what each asyncio task of a running worker is waiting on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import faust

from processors.assembler import RolloutAssembly
from processors.dead_letters import dead_letter
from processors.errors import InvalidEvent, ProcessorError
from processors.grouper import GroupSlot, add_rollout, group_id_for
from processors.pipeline import process_group
from processors.stream.clock import PartitionClocks
from processors.stream.config import StreamConfig
from processors.stream.entries import GroupEntry, pack_entry, read_body, read_head
from processors.stream.topics import partition_for, record_key
from schemas.codec import DecodeError, get_codec
from schemas.kafka_config import faust_app_settings

log = logging.getLogger("tokentrail.processors")

Record = dict[str, Any]
Encoded = tuple[str, bytes, bytes]  # (topic, key, value)

# Keys and values stay bytes: the codec decodes them (and dead-letters what it cannot decode).
RAW_TOPIC: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                             "value_serializer": "raw"}
RAW_TABLE: dict[str, Any] = {"key_type": bytes, "value_type": bytes}
ENV_NAMES = ("AttemptStarted", "EnvStep", "AttemptFinished")
BAD_INPUT = (DecodeError, ProcessorError)
# Room for the table entry header and framing on top of the largest record.
SIZE_SLACK = 64 * 1024
# The watchdog looks this often, and re-seeks an idle input partition that waits this long.
WATCHDOG_EVERY_S = 5.0
KICK_AFTER_S = 5.0
# The longest the watchdog waits for the consumer thread to answer an offsets query or a seek.
CONSUMER_ANSWER_S = 10.0
# A partition rewound to a dropped message that still sees only later ones after this long seeks again.
REWIND_RETRY_S = 2.0
# How often finished input offsets are committed (faust's own commit runs on its acks as well).
COMMIT_EVERY_S = 3.0


class StalledError(RuntimeError):
    """Input partitions have messages waiting and nothing is being processed."""


class ProcessorsApp:
    """Builds the faust app, its tables, agents and timers for one StreamConfig."""

    def __init__(self, cfg: StreamConfig) -> None:
        self.cfg = cfg
        settings = cfg.settings
        self.codec = get_codec(settings.kafka.schema_registry_url)
        self.topics = cfg.topics
        self.partitions = {spec.name: spec.partition_count(settings.kafka) for spec in cfg.topics.specs()}
        self.n_partitions = settings.kafka.partitions
        self.timeout_us = round(settings.processors.attempt_timeout_s * 1e6)
        self.retention_us = round(cfg.state_retention_s * 1e6)
        self.stats: Counter[str] = Counter()
        self.crashed: BaseException | None = None

        max_bytes = settings.kafka.max_message_bytes + SIZE_SLACK
        options = {**faust_app_settings(settings.kafka), "producer_max_request_size": max_bytes,
                   "consumer_max_fetch_size": max_bytes}
        self.app = faust.App(
            cfg.app_id,
            **options,
            store="memory://",
            processing_guarantee="at_least_once",
            web_enabled=False,
            autodiscover=False,
            datadir=str(settings.processors.state_dir / cfg.app_id),
            # Standby copies would be restored behind our back; the memory store rebuilds from the
            # changelog when a partition arrives.
            table_standby_replicas=0,
            broker_session_timeout=cfg.session_timeout_s,
            broker_heartbeat_interval=max(cfg.session_timeout_s / 4, 0.5),
            stream_buffer_maxsize=256,
            consumer_group_instance_id=cfg.instance_id,
        )
        table_topic = {"max.message.bytes": str(max_bytes), "compression.type": settings.kafka.compression}
        self.assembly = self.app.Table("assembly", **RAW_TABLE, partitions=self.n_partitions,
                                       extra_topic_configs=table_topic,
                                       help="RolloutAssembly per rollout id (open attempts, emitted markers)")
        self.slots = self.app.Table("group-slots", **RAW_TABLE, partitions=self.n_partitions,
                                    extra_topic_configs=table_topic,
                                    help="GroupSlot per group id, with the rollouts already emitted")
        self.members = self.app.Table("group-members", **RAW_TABLE, partitions=self.n_partitions,
                                      extra_topic_configs=table_topic,
                                      help="encoded member rollouts of open groups, by group id + event id")
        self._out: dict[str, faust.TopicT] = {}
        self.assembler_lock = asyncio.Lock()
        self.grouper_lock = asyncio.Lock()
        self.assembler_clock = PartitionClocks()
        self.grouper_clock = PartitionClocks()
        self._last_stats: dict[str, int] = {}
        # Watchdog: per input partition, the next offset to process and since when it has been behind.
        self._next_offset: dict[Any, int] = {}
        self._behind_since: dict[Any, tuple[int, float]] = {}
        self._unready_since: float | None = None
        self._kicked: set[Any] = set()
        self._consumer_silent_since: float | None = None
        # Input partitions rewound to their next offset: (that offset, the first offset seen past it,
        # when the seek was made); see _in_order.
        self._rewinding: dict[Any, tuple[int, int, float]] = {}
        self._inputs = {self.topics.calls, self.topics.env, self.topics.rollouts, self.topics.by_group}
        self._commit_lock = asyncio.Lock()

        app = self.app
        inputs = app.topic(self.topics.calls, self.topics.env, **RAW_TOPIC)
        app.agent(inputs, name="assembler", concurrency=1)(self._stream_of(self._assemble))
        app.agent(app.topic(self.topics.rollouts, **RAW_TOPIC), name="router", concurrency=1)(
            self._stream_of(self._route))
        app.agent(app.topic(self.topics.by_group, **RAW_TOPIC), name="grouper", concurrency=1)(
            self._stream_of(self._group))
        app.timer(cfg.tick_s, name="assembler-timer")(self._guarded(self._assembler_tick))
        app.timer(cfg.tick_s, name="grouper-timer")(self._guarded(self._grouper_tick))
        app.timer(10.0, name="progress")(self._report_progress)
        app.task(self._install_task_dump)
        app.task(self._own_commits)
        app.on_partitions_revoked.connect(self._on_revoked)
        # faust commits only when it has new acks of its own; this commits what the agents finished.
        app.timer(COMMIT_EVERY_S, name="commit")(self._guarded(self._commit_tick))
        if cfg.stall_timeout_s > 0:
            app.timer(min(WATCHDOG_EVERY_S, cfg.stall_timeout_s / 3), name="watchdog")(self._guarded(self._watchdog))

    # ------------------------------------------------------------------------------ plumbing

    def _stream_of(self, handle: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        guarded = self._guarded(handle)

        async def agent(stream: Any) -> None:
            async for event in stream.events():
                message = event.message
                if await self._in_order(message):
                    await guarded(message)
                    self._next_offset[message.tp] = message.offset + 1

        agent.__name__ = agent.__qualname__ = handle.__name__.lstrip("_")
        return agent

    async def _in_order(self, message: Any) -> bool:
        """Whether ``message`` is the next one its partition's agent must process.

        Each input partition is processed strictly in offset order from where it was committed. In a
        rebalance faust drops the messages it fetched under the old generation; where the partition has
        no committed offset yet, it does not seek back, so the agent would next see a later message and
        the dropped ones never (seen as an attempt whose AttemptStarted was never assembled, its later
        events processed and committed). A message past the next offset therefore rewinds the partition
        to it (the later messages already buffered are passed over until the re-read reaches them), and
        one before it was processed already (faust re-delivers from the committed offset). Where the
        re-read itself starts past the next offset, the offsets between hold no records (transaction
        markers, compaction) and processing goes on from there."""
        tp, offset = message.tp, message.offset
        expected = self._next_offset.get(tp)
        if expected is None:
            expected = await self._resume_offset(tp, offset)
            self._next_offset[tp] = expected
        if offset == expected:
            self._rewinding.pop(tp, None)
            return True
        if offset < expected:
            self.stats["skipped.processed_before"] += 1
            return False
        rewind = self._rewinding.get(tp)
        if rewind is not None and rewind[0] == expected:
            if offset <= rewind[1]:
                # Read again from ``expected`` and still past it: offsets expected..offset-1 hold no
                # records (transaction markers, compaction); nothing was dropped there.
                del self._rewinding[tp]
                self.stats["skipped.no_records"] += offset - expected
                self._next_offset[tp] = offset
                return True
            if time.monotonic() - rewind[2] >= REWIND_RETRY_S:
                # Still only messages fetched before the seek: faust's fetcher may have dropped the
                # re-read (it drops offsets below the last one it delivered); seek again.
                await self._seek_back(tp, expected, rewind[1])
            return False
        start = await self._log_start(tp)
        if start is not None and start > expected:
            # Retention deleted what was not processed yet: nothing to rewind to.
            log.warning("%s[%s]: offsets %s..%s were deleted by retention before they were processed",
                        tp.topic, tp.partition, expected, start - 1)
            self.stats["lost.retention"] += start - expected
            expected = self._next_offset[tp] = start
            if offset == expected:
                return True
        self.stats["rewinds"] += 1
        log.warning("%s[%s]: offset %s arrived before offset %s was processed; seeking back to it",
                    tp.topic, tp.partition, offset, expected)
        await self._seek_back(tp, expected, offset)
        return False

    async def _seek_back(self, tp: Any, expected: int, first_ahead: int) -> None:
        self._rewinding[tp] = (expected, first_ahead, time.monotonic())
        try:
            await asyncio.wait_for(self.app.consumer.seek(tp, expected), CONSUMER_ANSWER_S)
        except Exception as exc:  # revoked meanwhile, or a silent consumer: the watchdog is the backstop
            log.warning("seeking %s[%s] back failed: %r", tp.topic, tp.partition, exc)

    async def _resume_offset(self, tp: Any, offset: int) -> int:
        """Where processing of a newly assigned partition resumes: its committed offset, or (none
        committed) its log start; the message's own offset where neither can be had."""
        committed = self.app.consumer._committed_offset.get(tp)  # the broker's, read after the assignment
        if committed is not None:
            return int(committed)
        start = await self._log_start(tp)
        if start is None:
            log.warning("%s[%s]: log start unknown; resuming at offset %s", tp.topic, tp.partition, offset)
            return offset
        return start

    async def _log_start(self, tp: Any) -> int | None:
        try:
            earliest = await asyncio.wait_for(self.app.consumer.earliest_offsets(tp), CONSUMER_ANSWER_S)
        except Exception as exc:
            log.warning("%s[%s]: log start offset unavailable (%r)", tp.topic, tp.partition, exc)
            return None
        start = earliest.get(tp)
        return None if start is None else int(start)

    async def _on_revoked(self, sender: Any, revoked: Any, **_: Any) -> None:
        """A revoked partition resumes from its committed offset if it comes back (another worker may
        have moved it on meanwhile)."""
        for tp in revoked:
            self._next_offset.pop(tp, None)
            self._rewinding.pop(tp, None)

    def _guarded(self, fn: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        """Unexpected errors stop the worker (it restarts from committed offsets) instead of being
        swallowed; bad input never gets here (it is dead-lettered)."""

        @functools.wraps(fn)
        async def run(*args: Any) -> None:
            try:
                await fn(*args)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("processors worker failed; stopping so it restarts from committed offsets")
                self.crashed = exc
                await self.app.crash(exc)
                raise

        return run

    def _topic(self, name: str) -> faust.TopicT:
        if name not in self._out:
            self._out[name] = self.app.topic(name, **RAW_TOPIC)
        return self._out[name]

    async def _send(self, items: list[Encoded]) -> None:
        """Produce, then wait until the broker acknowledged every message."""
        futures = []
        for topic, key, value in items:
            partition = partition_for(key, self.partitions.get(topic, self.n_partitions))
            futures.append(await self._topic(topic).send(key=key, value=value, partition=partition, force=True))
        if futures:
            await asyncio.gather(*futures)

    def _encode(self, records: list[tuple[str, Record]]) -> list[Encoded]:
        """Encode every output first, so a record that does not fit its schema sends nothing."""
        out = []
        for name, record in records:
            try:
                value = self.codec.encode(name, record)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise InvalidEvent(f"output {name} {record.get('event_id')} does not fit its schema: "
                                   f"{exc!r}") from exc
            out.append((self.topics.output(name), record_key(name, record).encode(), value))
            self.stats[f"out.{name}"] += 1
        return out

    async def _put(self, table: Any, partition: int, key: bytes, value: bytes) -> None:
        """Write a table entry and wait for its changelog write (explicit partition: timers write too)."""
        table.data[key] = value
        # The memory store drops keys of partitions this worker no longer owns after each recovery,
        # but knows the partition only of keys it restored itself: tell it about ours.
        owner = getattr(table.data, "_key_partition", None)
        if owner is not None:
            owner[key] = partition
        future = await table.changelog_topic.send(key=key, value=value, partition=partition, force=True)
        await future

    async def _delete(self, table: Any, partition: int, key: bytes) -> None:
        table.data.pop(key, None)
        owner = getattr(table.data, "_key_partition", None)
        if owner is not None:
            owner.pop(key, None)
        future = await table.changelog_topic.send(key=key, value=None, partition=partition, force=True)
        await future

    async def _dead_letter(self, stage: str, message: Any, error: BaseException | str) -> None:
        record = dead_letter(stage=stage, source_topic=message.topic, partition=message.partition,
                             offset=message.offset, key=message.key, value=message.value, error=error,
                             created_at_us=round(message.timestamp * 1000) * 1000)
        key = message.key or b""
        topic = self.topics.dead_letter
        n = self.partitions.get(topic, self.n_partitions)
        partition = partition_for(key, n) if key else message.partition % n
        value = self.codec.encode("DeadLetter", record)
        future = await self._topic(topic).send(key=message.key, value=value, partition=partition, force=True)
        await future
        self.stats[f"dead_letter.{stage}"] += 1
        log.warning("dead-lettered %s[%s]@%s (%s): %s", message.topic, message.partition, message.offset,
                    record["error_type"], record["reason"][:300])

    def _ready(self) -> bool:
        """Timers act only between rebalances, once table recovery is done."""
        app = self.app
        return not (app.rebalancing or getattr(app, "in_recovery", False) or self.crashed)

    def _owned(self, topic: str) -> set[int]:
        return {tp.partition for tp in self.app.consumer.assignment() if tp.topic == topic}

    def _scan(self, table: Any, owned: set[int], clocks: PartitionClocks) -> list[tuple[bytes, bytes]]:
        """Entries of owned partitions (others belong to another worker now; the store drops them
        after the next recovery), seeding the clocks of partitions not seen yet."""
        entries, newest = [], {}
        for key, value in list(table.data.items()):
            head = read_head(value)
            if head.partition not in owned:
                continue
            entries.append((key, value))
            newest[head.partition] = max(newest.get(head.partition, head.event_us), head.event_us)
        for partition, event_us in newest.items():
            if clocks.now_us(partition) is None:
                clocks.observe(partition, event_us)
        for partition in clocks.known() - owned:
            clocks.forget(partition)
        return entries

    async def _own_commits(self) -> None:
        """Replace faust's commit by ``_commit_finished``.

        faust commits what it acked, and it acks the messages it skips during a rebalance (fetched
        under an older generation), so its commit can pass input no agent handled; a kill -9 before
        the re-read lost them for good. Capping faust's offsets is not enough: faust then records an
        offset as committed that the broker never got, and its ack bookkeeping (acks below the
        committed offset are ignored; a gap after it stops its commits) drifts from the broker's."""
        self.app.consumer._commit_offsets = self._commit_finished

    async def _commit_finished(self, offsets: Any = None, start_new_transaction: bool = True) -> bool:
        """Commit each assigned input partition exactly where its agent stopped (``_next_offset``), where
        that moved, and record exactly that as faust's committed offset. A partition with nothing
        finished since it was assigned is not committed. (The signature is faust's ``_commit_offsets``.)"""
        consumer = self.app.consumer
        async with self._commit_lock:
            assignment = consumer.assignment()
            committed = consumer._committed_offset
            todo = {tp: offset for tp, offset in (offsets or {}).items()
                    if tp.topic not in self._inputs and tp in assignment}  # none today; kept as faust has them
            for tp, done in self._next_offset.items():
                if tp in assignment and (committed.get(tp) is None or done > committed[tp]):
                    todo[tp] = done
            if not todo:
                return False
            await self.app.producer.flush()
            if not await consumer._commit(todo):
                return False
            committed.update(todo)
            return True

    async def _commit_tick(self) -> None:
        if self._ready():
            await self._commit_finished()

    async def _install_task_dump(self) -> None:
        """``kill -USR1 <pid>`` logs what every asyncio task of the worker is waiting on."""
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self._dump_tasks)

    async def _watchdog(self) -> None:
        """A worker whose input partitions have unprocessed messages and make no progress for
        ``stall_timeout_s`` logs what it is waiting on and stops (exit code 3), so its supervisor
        restarts it; a restart resumes from committed offsets and restored tables. A rebalance or
        table recovery that does not finish within the same time stops the worker as well."""
        now = time.monotonic()
        if not self._ready():
            self._behind_since.clear()
            if self._unready_since is None:
                self._unready_since = now
            elif now - self._unready_since >= self.cfg.stall_timeout_s and not self.crashed:
                self._dump_tasks()
                raise StalledError(f"rebalance / table recovery unfinished after {self.cfg.stall_timeout_s:g}s")
            return
        self._unready_since = None
        assignment = self.app.consumer.assignment()  # revoked partitions left _next_offset (_on_revoked)
        tps = [tp for tp in assignment if tp.topic in self._inputs]
        if not tps:
            return
        committed = getattr(self.app.consumer, "_committed_offset", {})
        # A partition that never delivered a message has no position of ours and maybe no committed
        # offset: it starts at its earliest offset (auto_offset_reset=earliest). A stall there is the
        # worst kind (nothing of it was ever processed), so it must count too.
        unknown = [tp for tp in tps if self._next_offset.get(tp, committed.get(tp)) is None]
        try:
            # Bounded: the consumer thread answers these, and a stuck consumer thread is what a stalled
            # fetch can look like (a watchdog awaiting it forever would never stop the worker).
            ends = await asyncio.wait_for(self.app.consumer.highwaters(*tps), CONSUMER_ANSWER_S)
            earliest = (await asyncio.wait_for(self.app.consumer.earliest_offsets(*unknown), CONSUMER_ANSWER_S)
                        if unknown else {})
        except TimeoutError:
            self._consumer_silent_since = self._consumer_silent_since or now
            silent = now - self._consumer_silent_since
            log.warning("watchdog: the consumer has not answered offset queries for %.0fs", silent)
            if silent >= self.cfg.stall_timeout_s:
                self._dump_tasks()
                raise StalledError(f"consumer unresponsive for {silent:.0f}s") from None
            return
        except Exception as exc:  # a rebalance began meanwhile (partitions no longer assigned): look next time
            log.info("watchdog: offsets unavailable this time (%r)", exc)
            return
        self._consumer_silent_since = None
        stalled = []
        for tp in tps:
            position = self._next_offset.get(tp, committed.get(tp))
            if position is None:
                position = earliest.get(tp)
            if position is None or ends.get(tp, 0) <= position:
                self._behind_since.pop(tp, None)
                continue
            since = self._behind_since.get(tp)
            if since is None or since[0] != position:
                self._behind_since[tp] = (position, now)
                self._kicked.discard(tp)
            elif now - since[1] >= self.cfg.stall_timeout_s:
                stalled.append(f"{tp.topic}[{tp.partition}] at offset {position} of {ends[tp]}")
            elif (now - since[1] >= min(KICK_AFTER_S, self.cfg.stall_timeout_s / 3) and tp not in self._kicked
                  and not self._busy(tp.topic)):
                # First remedy: re-position the fetcher at the next offset to process. After a rebalance
                # the consumer sometimes never fetches a partition that has no committed offset yet (seen
                # with faust-streaming 0.15 / aiokafka 0.14); a seek makes it fetch again. Only when the
                # agent is idle: a busy agent (a slow verifier) is not stuck.
                self._kicked.add(tp)
                self.stats["watchdog.seeks"] += 1
                log.warning("watchdog: %s[%s] waits at offset %s of %s; seeking there", tp.topic, tp.partition,
                            position, ends[tp])
                try:
                    await asyncio.wait_for(self.app.consumer.seek(tp, position), CONSUMER_ANSWER_S)
                except Exception as exc:  # e.g. revoked by a rebalance meanwhile: the stall exit stays the backstop
                    log.warning("watchdog: seeking %s[%s] failed: %r", tp.topic, tp.partition, exc)
        if stalled:
            self._dump_tasks()
            raise StalledError(f"no progress for {self.cfg.stall_timeout_s:g}s on {', '.join(stalled)}")

    def _busy(self, topic: str) -> bool:
        """Whether the agent reading ``topic`` is processing a message right now."""
        if topic in (self.topics.calls, self.topics.env):
            return self.assembler_lock.locked()
        if topic == self.topics.by_group:
            return self.grouper_lock.locked()
        return False

    def _dump_tasks(self) -> None:
        app = self.app
        consumer = app.consumer
        log.warning("state: rebalancing=%s in_recovery=%s flow_active=%s assignment=%s active=%s paused=%s",
                    app.rebalancing, getattr(app, "in_recovery", None), app.flow_control.is_active(),
                    sorted(consumer.assignment()), sorted(getattr(consumer, "_active_partitions", None) or []),
                    sorted(getattr(consumer, "_paused_partitions", None) or []))
        for task in asyncio.all_tasks():
            frames = task.get_stack(limit=12)
            where = " <- ".join(f"{f.f_code.co_name}@{f.f_code.co_filename.rsplit('/', 2)[-1]}:{f.f_lineno}"
                                for f in reversed(frames))
            log.warning("task %s: %s", task.get_name(), where or "(not started)")
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():  # the consumer thread runs its own event loop
            stack = traceback.extract_stack(frame, limit=12)
            log.warning("thread %s: %s", names.get(ident, ident),
                        " <- ".join(f"{f.name}@{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in reversed(stack)))

    async def _report_progress(self) -> None:
        current = dict(self.stats)
        if current != self._last_stats:
            log.info("progress: %s", ", ".join(f"{k}={v}" for k, v in sorted(current.items())))
            self._last_stats = current

    # ------------------------------------------------------------------------------ assembler

    async def _assemble(self, message: Any) -> None:
        async with self.assembler_lock:
            self.stats["in.assembler"] += 1
            expect: str | tuple[str, ...] = "CallRecord" if message.topic == self.topics.calls else ENV_NAMES
            try:
                name, record = self.codec.decode(message.value, expect=expect, topic=message.topic,
                                                 partition=message.partition, offset=message.offset)
                rollout_id = record.get("rollout_id")
                if not rollout_id:
                    raise InvalidEvent(f"{name} {record.get('event_id')} has no rollout_id")
                if message.key != rollout_id.encode():
                    raise InvalidEvent(f"{name} {record.get('event_id')} has key {message.key!r}, not its "
                                       f"rollout id {rollout_id!r}: a rollout's events must share a partition")
                key = rollout_id.encode()
                stored = self.assembly.data.get(key)
                state = (RolloutAssembly.from_bytes(read_body(stored)) if stored is not None
                         else RolloutAssembly(rollout_id))
                accepted = state.accept(name, record)
                outputs = self._encode([("CompletedRollout", r) for r in accepted.rollouts])
            except BAD_INPUT as exc:
                await self._dead_letter("assembler", message, exc)
                return
            if accepted.duplicate or accepted.late:
                # Late: the attempt was emitted, and its rollout was acknowledged before that was stored.
                self.stats["skipped.assembler." + ("duplicate" if accepted.duplicate else "late")] += 1
                return
            self.assembler_clock.observe(message.partition, state.last_event_us)
            await self._send(outputs)
            await self._store_assembly(message.partition, key, state)

    async def _store_assembly(self, partition: int, key: bytes, state: RolloutAssembly) -> None:
        deadline = state.next_deadline_us(self.timeout_us)
        due = deadline if deadline is not None else state.last_event_us + self.retention_us
        await self._put(self.assembly, partition, key,
                        pack_entry(partition, due, state.last_event_us, state.to_bytes()))

    async def _assembler_tick(self) -> None:
        if not self._ready():
            return
        async with self.assembler_lock:
            owned = self._owned(self.topics.calls)
            for key, value in self._scan(self.assembly, owned, self.assembler_clock):
                head = read_head(value)
                now = self.assembler_clock.now_us(head.partition)
                if head.due_us is None or now is None or head.due_us > now:
                    continue
                state = RolloutAssembly.from_bytes(read_body(value))
                expired = state.expire_due(now, self.timeout_us)
                try:
                    outputs = self._encode([("CompletedRollout", r) for r in expired])
                except InvalidEvent:
                    log.exception("expired rollouts of %s cannot be encoded; dropping them", key)
                    outputs = []
                await self._send(outputs)
                self.stats["expired.attempts"] += len(expired)
                if state.can_forget(now, self.retention_us):
                    await self._delete(self.assembly, head.partition, key)
                    self.stats["forgot.rollouts"] += 1
                else:
                    await self._store_assembly(head.partition, key, state)
                if not self._ready():
                    return

    # ------------------------------------------------------------------------------ router

    async def _route(self, message: Any) -> None:
        self.stats["in.router"] += 1
        try:
            _, rollout = self.codec.decode(message.value, expect="CompletedRollout", topic=message.topic,
                                           partition=message.partition, offset=message.offset)
            if rollout["status"] != "COMPLETE" or not rollout["counted"]:
                self.stats["skipped.router.not_counted"] += 1
                return
            group_id = group_id_for(rollout, self.cfg.grouping)
        except BAD_INPUT as exc:
            await self._dead_letter("router", message, exc)
            return
        await self._send([(self.topics.by_group, group_id.encode(), message.value)])

    # ------------------------------------------------------------------------------ grouper

    @staticmethod
    def _member_key(group_id: str, rollout_event_id: str) -> bytes:
        return f"{group_id}\x00{rollout_event_id}".encode()

    async def _group(self, message: Any) -> None:
        async with self.grouper_lock:
            self.stats["in.grouper"] += 1
            cfg = self.cfg.grouping
            try:
                _, rollout = self.codec.decode(message.value, expect="CompletedRollout", topic=message.topic,
                                               partition=message.partition, offset=message.offset)
                group_id = group_id_for(rollout, cfg)
                key = group_id.encode()
                stored = self.slots.data.get(key)
                entry = GroupEntry.from_bytes(read_body(stored)) if stored is not None else None
                if entry is not None and rollout["event_id"] in entry.done:
                    self.stats["skipped.grouper.done"] += 1  # its group's outputs are on Kafka already
                    return
                slot, added = add_rollout(entry.slot if entry else None, rollout, cfg)
            except BAD_INPUT as exc:
                await self._dead_letter("grouper", message, exc)
                return
            partition = message.partition
            created = int(rollout["created_at_us"])
            self.grouper_clock.observe(partition, created)
            member_key = self._member_key(group_id, rollout["event_id"])
            if added.ignored:
                self.stats["skipped.grouper.ignored"] += 1
                if slot is not None and slot.is_open and any(m.event_id == rollout["event_id"]
                                                             for m in slot.members):
                    # A re-delivered member: its stored copy may be the write a crash lost.
                    await self._put(self.members, partition, member_key,
                                    pack_entry(partition, None, created, message.value))
                return
            assert slot is not None
            done = list(entry.done) if entry else []
            if not added.emitted:  # a new member of an open group: keep it until the group closes
                await self._put(self.members, partition, member_key,
                                pack_entry(partition, None, created, message.value))
                await self._store_slot(partition, key, GroupEntry(slot, done), created)
                return
            current = {rollout["event_id"]: rollout}
            for emitted in added.emitted:
                await self._close_group(emitted.group, current, message)
                done += emitted.group["rollout_event_ids"]
            await self._store_slot(partition, key, GroupEntry(slot, done), created)
            await self._drop_members(partition, group_id, [e.group for e in added.emitted])

    def _stored_members(self, group: Record, known: dict[str, Record]) -> list[Record]:
        rollouts = []
        for event_id in group["rollout_event_ids"]:
            if event_id in known:
                rollouts.append(known[event_id])
                continue
            stored = self.members.data.get(self._member_key(group["group_id"], event_id))
            if stored is None:
                raise InvalidEvent(f"group {group['event_id']}: member rollout {event_id} is not in the "
                                   "grouper's member table")
            rollouts.append(self.codec.decode(read_body(stored), expect="CompletedRollout")[1])
        return rollouts

    async def _close_group(self, group: Record, known: dict[str, Record], source: Any | None) -> None:
        """Run the stage pipeline for a closed group and produce everything it derives.

        The group record is produced even when its derivation fails (the failure is dead-lettered
        against the input that closed it, or logged when the timer closed it)."""
        outputs = self._encode([("RolloutGroup", group)])
        self.stats[f"groups.{group['status']}"] += 1
        try:
            rollouts = self._stored_members(group, known)
            call = functools.partial(process_group, group, rollouts, list(self.cfg.verifiers),
                                     self.cfg.stages.reward, self.cfg.stages.credit, self.cfg.stages.sample)
            derived = await asyncio.get_running_loop().run_in_executor(None, call)
            outputs += self._encode(derived.events())
        except ProcessorError as exc:
            if source is not None:
                await self._dead_letter("grouper", source, f"group {group['event_id']}: {exc}")
            else:
                log.error("group %s (%s) could not be derived: %s", group["event_id"], group["status"], exc)
                self.stats["failed.groups"] += 1
        await self._send(outputs)

    async def _store_slot(self, partition: int, key: bytes, entry: GroupEntry, event_us: int) -> None:
        slot, cfg = entry.slot, self.cfg.grouping
        if slot.is_open:
            due = slot.deadline_us(cfg)
        else:
            assert slot.closed_at_us is not None
            due = slot.closed_at_us + round(cfg.closed_retention_s * 1e6)
        await self._put(self.slots, partition, key, pack_entry(partition, due, event_us, entry.to_bytes()))

    async def _drop_members(self, partition: int, group_id: str, groups: list[Record]) -> None:
        for group in groups:
            for event_id in group["rollout_event_ids"]:
                member_key = self._member_key(group_id, event_id)
                if member_key in self.members.data:
                    await self._delete(self.members, partition, member_key)

    async def _grouper_tick(self) -> None:
        if not self._ready():
            return
        cfg = self.cfg.grouping
        async with self.grouper_lock:
            owned = self._owned(self.topics.by_group)
            for key, value in self._scan(self.slots, owned, self.grouper_clock):
                head = read_head(value)
                now = self.grouper_clock.now_us(head.partition)
                if head.due_us is None or now is None or head.due_us > now:
                    continue
                entry = GroupEntry.from_bytes(read_body(value))
                emitted = entry.slot.close_if_due(now, cfg)
                if emitted is not None:
                    await self._close_group(emitted.group, {}, None)
                    entry.done += emitted.group["rollout_event_ids"]
                    await self._store_slot(head.partition, key, entry, emitted.group["created_at_us"])
                    await self._drop_members(head.partition, entry.slot.group_id, [emitted.group])
                elif entry.slot.can_forget(now, cfg):
                    await self._delete(self.slots, head.partition, key)
                    self.stats["forgot.groups"] += 1
                if not self._ready():
                    return
            await self._drop_orphan_members(owned)

    async def _drop_orphan_members(self, owned: set[int]) -> None:
        """Member copies whose group no longer holds them open (left by a crash between writes)."""
        slots: dict[str, GroupSlot | None] = {}
        for key, value in self._scan(self.members, owned, PartitionClocks()):
            group_id, _, event_id = key.decode().partition("\x00")
            if group_id not in slots:
                stored = self.slots.data.get(group_id.encode())
                slots[group_id] = GroupEntry.from_bytes(read_body(stored)).slot if stored is not None else None
            slot = slots[group_id]
            if slot is None or not slot.is_open or all(m.event_id != event_id for m in slot.members):
                await self._delete(self.members, read_head(value).partition, key)
                self.stats["dropped.orphan_members"] += 1


def build_app(cfg: StreamConfig) -> ProcessorsApp:
    return ProcessorsApp(cfg)
