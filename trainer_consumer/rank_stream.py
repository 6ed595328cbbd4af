"""The sample stream for any trainer on any number of ranks: a rank-aware iterable with explicit commit.

Every rank iterates the same ``RankSampleStream``; rank 0 alone reads the samples topic (one consumer in
the group), cuts global batches with the trainer's filters and hands each rank its share
(``sharding.step_shares``: balanced by tokens, possibly empty). Each rank gets a ``RankBatch`` with its
samples and the GLOBAL loss denominator, so ``sum(local token losses) / denominator`` summed over ranks is
the one-process loss of the whole batch. After its optimizer step every rank calls ``commit(batch)``:
a collective that returns once every rank has called it, after which rank 0 commits the batch's offsets.

Guarantees: every record of the topic is in exactly one global batch (trained, or filtered and counted);
its offsets are committed only after every rank committed the step; a crash before that re-delivers the
batch (at least once across a crash; exactly once when the weights that trained it are saved with
``checkpoint()`` and the stream restarts from it, as the tokentrail trainer does). Batches in which every
record was filtered are committed by the stream itself and never yielded (``filtered`` counts them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trainer_consumer.batching import Batch
from trainer_consumer.dataset import Position, SampleStream
from trainer_consumer.losses import Normalization, loss_denominator
from trainer_consumer.ranks import RankGroup
from trainer_consumer.sample_view import TrainSample
from trainer_consumer.sharding import step_shares


@dataclass(frozen=True)
class RankBatch:
    """One rank's part of a global batch."""

    step: int  # global batch number in this stream (the same on every rank)
    samples: list[TrainSample]  # this rank's share; may be empty (the rank still joins the step)
    denominator: float  # the whole global batch's loss denominator
    rank: int
    world_size: int
    global_sample_ids: tuple[str, ...]  # every rank's samples, in batch order


class RankSampleStream:
    """``for batch in stream: ...train...; stream.commit(batch)`` on every rank (see the module docstring).

    ``source``: the Kafka ``SampleStream`` on rank 0, None on the others."""

    def __init__(self, group: RankGroup, source: SampleStream | None, idle_timeout_s: float = 5.0,
                 until_idle: bool = False, normalization: Normalization = "weight") -> None:
        if group.is_leader and source is None:
            raise ValueError("rank 0 reads the samples topic: give it the SampleStream")
        self.group = group
        self.source = source
        self.idle_timeout_s = idle_timeout_s
        self.until_idle = until_idle
        self.normalization = normalization
        self.filtered: Counter[str] = Counter()  # rank 0: records filtered, by reason
        self._step = 0
        self._pending: dict[int, Batch[Position]] = {}
        self._stopped = False

    def __iter__(self) -> Iterator[RankBatch]:
        while not self._stopped:
            share = self._next_share()
            if share is None:
                self._stopped = True
                return
            yield RankBatch(step=share.step, samples=share.samples, denominator=share.denominator,
                            rank=self.group.rank, world_size=self.group.world_size,
                            global_sample_ids=share.sample_ids_all)

    def _next_share(self) -> Any:
        if not self.group.is_leader:
            return self.group.scatter(None)
        assert self.source is not None
        while True:
            batch = self.source.next_batch(self.idle_timeout_s, flush_partial=self.until_idle)
            if batch is None:
                if self.until_idle:
                    self.close()
                    return None
                continue
            self.filtered.update(batch.filtered)
            denominator = loss_denominator(batch.samples, self.normalization) if batch.samples else 0.0
            if denominator <= 0:  # nothing to train in it: accounted for, committed, not yielded
                self.filtered["zero_weight_batch"] += len(batch.samples)
                self.source.commit(batch)
                continue
            self._step += 1
            self._pending[self._step] = batch
            return self.group.scatter(step_shares(self._step, batch.samples, self.group.world_size, denominator))

    def commit(self, batch: RankBatch) -> None:
        """Every rank, after its optimizer step on ``batch``: returns once all ranks have called it; then
        rank 0 commits the global batch's offsets."""
        self.group.barrier()
        if self.group.is_leader:
            assert self.source is not None
            self.source.commit(self._pending.pop(batch.step))

    def checkpoint(self, batch: RankBatch) -> list[list[Any]]:
        """Rank 0: the offsets reading resumes from once ``batch`` is committed; save them with the weights
        and pass them as ``SampleStream(start_after=...)`` on restart, so a batch trained and saved but not
        yet committed is not trained again."""
        assert self.source is not None
        return self.source.checkpoint(self._pending[batch.step])

    def close(self) -> None:
        """Rank 0: tells the other ranks the stream has ended (their iteration stops)."""
        if self.group.is_leader and self.group.distributed and not self._stopped:
            self._stopped = True
            self.group.scatter([None] * self.group.world_size)
