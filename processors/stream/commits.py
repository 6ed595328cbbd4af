"""Input offsets: every input partition is processed strictly in offset order, and committed exactly
where its agent stopped.

Each input partition is processed strictly in offset order from its committed offset (``in_order``):
in a rebalance faust drops the messages it fetched under the old generation and, where a partition has
no committed offset yet, does not seek back, so an agent would go on past them; a message ahead of the
next offset rewinds the partition to it instead. faust also acks what it drops, which would let its
commit pass unprocessed input; the worker commits input offsets itself, exactly where each agent
stopped (``install`` / ``commit_finished``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

import faust

from processors.stream.health import WorkerHealth

log = logging.getLogger("tokentrail.processors")

# The longest the worker waits for the consumer thread to answer an offsets query or a seek.
CONSUMER_ANSWER_S = 10.0
# A partition rewound to a dropped message that still sees only later ones after this long seeks again.
REWIND_RETRY_S = 2.0
# How often finished input offsets are committed (faust's own commit runs on its acks as well).
COMMIT_EVERY_S = 3.0


class InputOffsets:
    """Per input partition, the next offset its agent must process; the app's own offset commits."""

    def __init__(self, app: faust.App, inputs: set[str], health: WorkerHealth, stats: Counter[str]) -> None:
        self.app = app
        self.inputs = inputs  # the topics the agents read
        self.health = health
        self.stats = stats
        # Per input partition, the next offset to process (what its agent finished, plus one).
        self.next_offset: dict[Any, int] = {}
        # Input partitions rewound to their next offset: (that offset, the first offset seen past it,
        # when the seek was made); see in_order.
        self._rewinding: dict[Any, tuple[int, int, float]] = {}
        self._commit_lock = asyncio.Lock()

    # ------------------------------------------------------------------------------ offset order

    async def in_order(self, message: Any) -> bool:
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
        expected = self.next_offset.get(tp)
        if expected is None:
            expected = await self._resume_offset(tp, offset)
            self.next_offset[tp] = expected
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
                self.next_offset[tp] = offset
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
            expected = self.next_offset[tp] = start
            if offset == expected:
                return True
        self.stats["rewinds"] += 1
        log.warning("%s[%s]: offset %s arrived before offset %s was processed; seeking back to it",
                    tp.topic, tp.partition, offset, expected)
        await self._seek_back(tp, expected, offset)
        return False

    def done(self, message: Any) -> None:
        """The agent finished ``message``: its partition goes on (and commits up to) the next offset."""
        self.next_offset[message.tp] = message.offset + 1

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

    async def on_revoked(self, sender: Any, revoked: Any, **_: Any) -> None:
        """A revoked partition resumes from its committed offset if it comes back (another worker may
        have moved it on meanwhile)."""
        for tp in revoked:
            self.next_offset.pop(tp, None)
            self._rewinding.pop(tp, None)

    # ------------------------------------------------------------------------------ commits

    async def install(self) -> None:
        """Replace faust's commit by ``commit_finished``.

        faust commits what it acked, and it acks the messages it skips during a rebalance (fetched
        under an older generation), so its commit can pass input no agent handled; a kill -9 before
        the re-read lost them for good. Capping faust's offsets is not enough: faust then records an
        offset as committed that the broker never got, and its ack bookkeeping (acks below the
        committed offset are ignored; a gap after it stops its commits) drifts from the broker's."""
        self.app.consumer._commit_offsets = self.commit_finished

    async def commit_finished(self, offsets: Any = None, start_new_transaction: bool = True) -> bool:
        """Commit each assigned input partition exactly where its agent stopped (``next_offset``), where
        that moved, and record exactly that as faust's committed offset. A partition with nothing
        finished since it was assigned is not committed. (The signature is faust's ``_commit_offsets``.)"""
        consumer = self.app.consumer
        async with self._commit_lock:
            assignment = consumer.assignment()
            committed = consumer._committed_offset
            todo = {tp: offset for tp, offset in (offsets or {}).items()
                    if tp.topic not in self.inputs and tp in assignment}  # none today; kept as faust has them
            for tp, done in self.next_offset.items():
                if tp in assignment and (committed.get(tp) is None or done > committed[tp]):
                    todo[tp] = done
            if not todo:
                return False
            await self.app.producer.flush()
            if not await consumer._commit(todo):
                return False
            committed.update(todo)
            return True

    async def commit_tick(self) -> None:
        """The commit timer: faust commits only when it has new acks of its own."""
        if self.health.ready():
            await self.commit_finished()
