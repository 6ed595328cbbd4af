"""One optimizer step on a list of samples: micro-batches, gradient accumulation, AdamW.

No Kafka, no files: the learner owns a model and its optimizer and turns samples into an update.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer_consumer.behaviour import BehaviourLogprobs
from trainer_consumer.collate import Layout, TokenBatch, collate, split_micro_batches
from trainer_consumer.losses import LossConfig, LossStats, loss_denominator, policy_loss, token_logprobs
from trainer_consumer.mismatch import MismatchStats, mismatch_stats
from trainer_consumer.sample_view import TrainSample


@dataclass(frozen=True)
class LearnerConfig:
    layout: Layout = "padded"
    micro_batch_tokens: int | None = 8192  # None: the whole step in one forward pass
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float | None = 1.0
    loss: LossConfig = field(default_factory=LossConfig)
    # |trainer - engine| logprob above this counts as beyond the bound in the step's mismatch figures.
    mismatch_bound: float = 0.2


@dataclass(frozen=True)
class StepResult:
    stats: LossStats
    grad_norm: float
    samples: int
    tokens: int  # every token forwarded (prompt and output)
    micro_batches: int
    seconds: float
    mismatch: MismatchStats = field(default_factory=MismatchStats)
    # Several ranks (trainer_consumer/rank_learner.py): how many took the step, each rank's tokens, and the
    # rank that trained each sample. One process: 1, (), {} (every sample on rank 0).
    ranks: int = 1
    rank_tokens: tuple[int, ...] = ()
    sample_ranks: Mapping[str, int] = field(default_factory=dict)


class Learner:
    def __init__(self, model: Any, cfg: LearnerConfig, pad_id: int = 0) -> None:
        self.model = model
        self.cfg = cfg
        self.pad_id = pad_id
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.learning_rate, betas=cfg.betas, weight_decay=cfg.weight_decay,
        )
        # What the forward passes go through (a DDP wrapper on several ranks) and where batches go.
        self.forward_model: Any = model
        self.device = next(model.parameters()).device

    @property
    def world_size(self) -> int:
        return 1

    def weights_replaced(self) -> None:
        """Told when the weights and optimizer state were replaced outside a step (a rollback's resume);
        several ranks bring every replica to them before the next step."""

    def micro_batch_context(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Around each micro-batch's forward and backward; on several ranks the gradients are summed
        across ranks in the last one's backward only."""
        return contextlib.nullcontext()

    def accumulate_gradients(self, samples: Sequence[TrainSample], behaviour: BehaviourLogprobs | None = None,
                             mismatch: MismatchStats | None = None,
                             denominator: float | None = None) -> tuple[LossStats, int]:
        """Zeroes the gradients, then backwards every micro-batch's share of the step loss.

        ``behaviour`` gives the trainer's logprobs under each sample's behaviour weights (for the
        importance correction and, into ``mismatch``, the engine/trainer comparison). ``denominator``:
        the whole step's (all ranks' samples); None computes it from ``samples``. Returns the summed
        stats and the number of micro-batches."""
        if not samples:
            raise ValueError("a step needs at least one sample")
        if denominator is None:
            denominator = loss_denominator(samples, self.cfg.loss.normalization)
        if denominator <= 0:
            raise ValueError("the step's samples carry no loss weight (denominator 0)")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        stats = LossStats()
        micro = split_micro_batches(samples, self.cfg.micro_batch_tokens)
        for i, part in enumerate(micro):
            with self.micro_batch_context(last=i == len(micro) - 1):
                batch = collate(part, self.cfg.layout, pad_id=self.pad_id).to(self.device)
                logp = token_logprobs(self.forward_model, batch)
                old = self._behaviour_tensor(part, batch, logp, behaviour)
                if old is not None and mismatch is not None:
                    compared = batch.loss_mask & torch.isfinite(old)
                    mismatch.add(mismatch_stats(old, batch.rollout_logprobs, compared, self.cfg.mismatch_bound))
                loss, part_stats = policy_loss(logp, batch, denominator, self.cfg.loss, old)
                loss.backward()
            stats.add(part_stats)
        return stats, len(micro)

    @staticmethod
    def _behaviour_tensor(part: Sequence[TrainSample], batch: TokenBatch, logp: torch.Tensor,
                          behaviour: BehaviourLogprobs | None) -> torch.Tensor | None:
        """Behaviour logprobs in the batch's shape, NaN where unknown. For samples sampled by the
        weights this step starts from, they are this forward pass's own logprobs (detached): the
        weights do not change until every micro-batch has been forwarded."""
        if behaviour is None:
            return None
        values, reuse = behaviour.flat(part)
        return torch.where(batch.from_flat(reuse, fill=False), logp.detach(),
                           batch.from_flat(values, fill=float("nan")))

    def step(self, samples: Sequence[TrainSample], behaviour: BehaviourLogprobs | None = None,
             denominator: float | None = None) -> StepResult:
        started = time.perf_counter()
        mismatch = MismatchStats(bound=self.cfg.mismatch_bound)
        try:
            stats, micro = self.accumulate_gradients(samples, behaviour, mismatch, denominator)
            params = [p for p in self.model.parameters() if p.grad is not None]
            if self.cfg.max_grad_norm is not None:
                norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm))
            else:
                norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))
            if not math.isfinite(norm):
                # A non-finite gradient would poison the weights every later sample is judged against.
                self.optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError(f"non-finite gradient norm {norm}; step skipped")
            self.optimizer.step()
        finally:
            self.model.eval()
        return StepResult(stats=stats, grad_norm=norm, samples=len(samples),
                          tokens=sum(s.num_tokens for s in samples), micro_batches=micro,
                          seconds=time.perf_counter() - started, mismatch=mismatch)

    @torch.no_grad()
    def sample_logprobs(self, samples: Sequence[TrainSample]) -> torch.Tensor:
        """Flat per-token log probabilities of the samples under the current weights."""
        self.model.eval()
        batch = collate(samples, self.cfg.layout, pad_id=self.pad_id)
        return batch.flat_tokens(token_logprobs(self.model, batch))
