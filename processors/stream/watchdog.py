"""The stall watchdog, and the task dump it (and ``kill -USR1 <pid>``) logs.

The watchdog watches the input partitions: one whose messages wait while its idle agent gets nothing
for 5 s is re-seeked to its next offset (after a rebalance the faust/aiokafka consumer sometimes never
fetches a partition that has no committed offset yet); input that still waits after ``stall_timeout_s``,
or a rebalance that does not finish in that time, stops the worker (exit code 3) for its supervisor to
restart. ``kill -USR1 <pid>`` logs what each asyncio task of a running worker is waiting on.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any

import faust

from processors.stream.commits import CONSUMER_ANSWER_S, InputOffsets
from processors.stream.health import WorkerHealth

log = logging.getLogger("tokentrail.processors")

# The watchdog looks this often, and re-seeks an idle input partition that waits this long.
WATCHDOG_EVERY_S = 5.0
KICK_AFTER_S = 5.0


class StalledError(RuntimeError):
    """Input partitions have messages waiting and nothing is being processed."""


class Watchdog:
    """Stops a worker whose input waits and makes no progress for ``stall_timeout_s``."""

    def __init__(self, app: faust.App, offsets: InputOffsets, health: WorkerHealth, stats: Counter[str],
                 stall_timeout_s: float, busy: dict[str, asyncio.Lock]) -> None:
        self.app = app
        self.offsets = offsets
        self.health = health
        self.stats = stats
        self.stall_timeout_s = stall_timeout_s
        self._busy_locks = busy  # input topic -> the lock its agent holds while processing a message
        # Per input partition, since when it has been behind (at which position).
        self._behind_since: dict[Any, tuple[int, float]] = {}
        self._unready_since: float | None = None
        self._kicked: set[Any] = set()
        self._consumer_silent_since: float | None = None

    @property
    def every_s(self) -> float:
        """How often the watchdog looks."""
        return min(WATCHDOG_EVERY_S, self.stall_timeout_s / 3)

    async def check(self) -> None:
        """A worker whose input partitions have unprocessed messages and make no progress for
        ``stall_timeout_s`` logs what it is waiting on and stops (exit code 3), so its supervisor
        restarts it; a restart resumes from committed offsets and restored tables. A rebalance or
        table recovery that does not finish within the same time stops the worker as well."""
        now = time.monotonic()
        if not self.health.ready():
            self._behind_since.clear()
            if self._unready_since is None:
                self._unready_since = now
            elif now - self._unready_since >= self.stall_timeout_s and not self.health.crashed:
                self.dump_tasks()
                raise StalledError(f"rebalance / table recovery unfinished after {self.stall_timeout_s:g}s")
            return
        self._unready_since = None
        next_offset = self.offsets.next_offset
        assignment = self.app.consumer.assignment()  # revoked partitions left next_offset (on_revoked)
        tps = [tp for tp in assignment if tp.topic in self.offsets.inputs]
        if not tps:
            return
        committed = getattr(self.app.consumer, "_committed_offset", {})
        # A partition that never delivered a message has no position of ours and maybe no committed
        # offset: it starts at its earliest offset (auto_offset_reset=earliest). A stall there is the
        # worst kind (nothing of it was ever processed), so it must count too.
        unknown = [tp for tp in tps if next_offset.get(tp, committed.get(tp)) is None]
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
            if silent >= self.stall_timeout_s:
                self.dump_tasks()
                raise StalledError(f"consumer unresponsive for {silent:.0f}s") from None
            return
        except Exception as exc:  # a rebalance began meanwhile (partitions no longer assigned): look next time
            log.info("watchdog: offsets unavailable this time (%r)", exc)
            return
        self._consumer_silent_since = None
        stalled = []
        for tp in tps:
            position = next_offset.get(tp, committed.get(tp))
            if position is None:
                position = earliest.get(tp)
            if position is None or ends.get(tp, 0) <= position:
                self._behind_since.pop(tp, None)
                continue
            since = self._behind_since.get(tp)
            if since is None or since[0] != position:
                self._behind_since[tp] = (position, now)
                self._kicked.discard(tp)
            elif now - since[1] >= self.stall_timeout_s:
                stalled.append(f"{tp.topic}[{tp.partition}] at offset {position} of {ends[tp]}")
            elif (now - since[1] >= min(KICK_AFTER_S, self.stall_timeout_s / 3) and tp not in self._kicked
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
            self.dump_tasks()
            raise StalledError(f"no progress for {self.stall_timeout_s:g}s on {', '.join(stalled)}")

    def _busy(self, topic: str) -> bool:
        """Whether the agent reading ``topic`` is processing a message right now."""
        lock = self._busy_locks.get(topic)
        return lock is not None and lock.locked()

    async def install_task_dump(self) -> None:
        """``kill -USR1 <pid>`` logs what every asyncio task of the worker is waiting on."""
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self.dump_tasks)

    def dump_tasks(self) -> None:
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
