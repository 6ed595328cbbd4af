"""One global optimizer step on several ranks: DDP, every rank a full replica, gradients summed.

Why DDP and not FSDP2: the models this trainer runs fit on one device, and then DDP is the exact and
simple choice: one all-reduce of the gradients per step, every rank steps the same AdamW on the same
summed gradient, so the replicas stay identical and rank 0's weights ARE the policy (published as they
are, no gathering of shards). FSDP2 (``fully_shard``) is what a model too large for one device needs;
the step below does not depend on the wrapper beyond ``micro_batch_context``.

The gradients are SUMMED across ranks (a comm hook; DDP's default averages): each rank's loss is its
share's token losses over the GLOBAL step denominator, so the sum over ranks is exactly the one-process
step's gradient. Micro-batches accumulate locally under ``no_sync``; the last one's backward carries
the all-reduce. A rank with no samples still joins: one zero-weighted forward/backward, a zero
contribution to the sum (DDP needs every rank in every all-reduce).

Rank 0 runs the trainer loop (``trainer.TrainingLoop``) with this learner: ``step`` hands every rank its
share (``sharding.step_shares``), steps its own, and gathers every rank's report; that gather is the
barrier after which rank 0 publishes, emits the TrainerStep and commits. Other ranks run ``follow``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainer_consumer.behaviour import BehaviourLogprobs
from trainer_consumer.learner import Learner, LearnerConfig, StepResult
from trainer_consumer.losses import LossStats, loss_denominator
from trainer_consumer.mismatch import MismatchStats
from trainer_consumer.ranks import RankGroup
from trainer_consumer.sample_view import TrainSample
from trainer_consumer.sharding import StepShare, sample_ranks, step_shares


def sum_allreduce_hook(_state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the sum of the ranks' gradients (the default hook divides by the world size)."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()  # type: ignore[union-attr]
    return fut.then(lambda f: f.value()[0])


# DDP checks the hook's annotations as objects; this module's are strings (``from __future__ import annotations``).
sum_allreduce_hook.__annotations__ = {"_state": object, "bucket": dist.GradBucket,
                                  "return": torch.futures.Future[torch.Tensor]}


@dataclass
class RankReport:
    """What each rank says after its part of a step (gathered on every rank)."""

    samples: int = 0
    tokens: int = 0
    micro_batches: int = 0
    seconds: float = 0.0
    grad_norm: float = 0.0
    stats: LossStats = field(default_factory=LossStats)
    mismatch: MismatchStats = field(default_factory=MismatchStats)
    error: str = ""  # a non-finite gradient (the same on every rank: the summed gradient is shared)


class RankLearner(Learner):
    """A ``Learner`` whose steps are global steps of a ``RankGroup``."""

    def __init__(self, model: Any, cfg: LearnerConfig, group: RankGroup, pad_id: int = 0) -> None:
        model.to(group.device)
        super().__init__(model, cfg, pad_id=pad_id)
        self.group = group
        self.orders = 0  # global steps handed out (rank 0) or received (others)
        self._resync = False
        if group.distributed:
            # Rank 0's weights are broadcast to every rank here, so all replicas start alike.
            ddp = DistributedDataParallel(model, device_ids=[group.device] if group.device.type == "cuda" else None)
            ddp.register_comm_hook(None, sum_allreduce_hook)
            self.forward_model = ddp
            group.on_close(self.release_group)

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def release_group(self) -> None:
        """Drops the DDP wrapper (its reducer holds the process group); ``RankGroup.close`` calls it."""
        self.forward_model = self.model

    def weights_replaced(self) -> None:
        self._resync = True

    def micro_batch_context(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        if last or not isinstance(self.forward_model, DistributedDataParallel):
            return contextlib.nullcontext()
        return self.forward_model.no_sync()

    def accumulate_gradients(self, samples: Sequence[TrainSample], behaviour: BehaviourLogprobs | None = None,
                             mismatch: MismatchStats | None = None,
                             denominator: float | None = None) -> tuple[LossStats, int]:
        if samples:
            return super().accumulate_gradients(samples, behaviour, mismatch, denominator)
        # Nothing for this rank this step: join the gradient all-reduce with zeros.
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        out = self.forward_model(input_ids=ids, use_cache=False)
        (out.logits.sum() * 0.0).backward()
        return LossStats(), 0

    # ---------------------------------------------------------------- rank 0

    def step(self, samples: Sequence[TrainSample], behaviour: BehaviourLogprobs | None = None,
             denominator: float | None = None) -> StepResult:
        """The global step on ``samples`` (rank 0): every rank trains its share; the result sums them."""
        if not self.group.is_leader:
            raise RuntimeError("only rank 0 starts a global step; the other ranks follow()")
        if denominator is None:
            denominator = loss_denominator(samples, self.cfg.loss.normalization)
        self.orders += 1
        shares = step_shares(self.orders, samples, self.group.world_size, denominator, behaviour, self._resync)
        self._resync = False
        mine = self.group.scatter(shares)
        reports = self._run_share(mine)
        return _combine(reports, sample_ranks(shares), self.cfg.mismatch_bound)

    def stop_followers(self) -> None:
        """Tells the other ranks there are no more steps (rank 0, once, at the end)."""
        if self.group.distributed and self.group.is_leader:
            self.group.scatter([None] * self.group.world_size)

    # ---------------------------------------------------------------- every rank

    def _take_leader_weights(self) -> None:
        """Every replica takes rank 0's weights and, like rank 0 after a rollback's resume, clears the
        optimizer's moments."""
        with torch.no_grad():
            for tensor in self.model.state_dict().values():
                dist.broadcast(tensor, src=0)
        self.optimizer.state.clear()

    def _run_share(self, share: StepShare) -> list[RankReport]:
        if share.resync and self.group.distributed:
            self._take_leader_weights()
        started = time.perf_counter()
        report = RankReport(samples=len(share.samples), tokens=sum(s.num_tokens for s in share.samples))
        try:
            result = Learner.step(self, share.samples, share.behaviour, share.denominator)
            report.stats, report.mismatch = result.stats, result.mismatch
            report.micro_batches, report.grad_norm = result.micro_batches, result.grad_norm
        except FloatingPointError as exc:
            report.error = str(exc)
        report.seconds = time.perf_counter() - started
        reports = self.group.gather(report)
        errors = [r.error for r in reports if r.error]
        if errors:
            raise FloatingPointError(errors[0])
        return reports

    def follow(self) -> int:
        """Ranks other than 0: take every step rank 0 hands out until it says stop; returns the steps."""
        done = 0
        while True:
            share = self.group.scatter(None)
            if share is None:
                return done
            self.orders = share.step
            try:
                self._run_share(share)
            except FloatingPointError:
                pass  # rank 0 records the skipped step; the weights were left as they were everywhere
            done += 1


def _combine(reports: list[RankReport], ranks_of: dict[str, int], bound: float) -> StepResult:
    stats, mismatch = LossStats(), MismatchStats(bound=bound)
    for r in reports:
        stats.add(r.stats)
        mismatch.add(r.mismatch)
    return StepResult(stats=stats, grad_norm=reports[0].grad_norm, samples=sum(r.samples for r in reports),
                      tokens=sum(r.tokens for r in reports), micro_batches=sum(r.micro_batches for r in reports),
                      seconds=max(r.seconds for r in reports), mismatch=mismatch, ranks=len(reports),
                      rank_tokens=tuple(r.tokens for r in reports), sample_ranks=ranks_of)
