"""Engine/trainer log-probability mismatch: the same sampled tokens, scored by the engine at sampling
time (the rollout logprobs on the sample) and by the trainer under the same policy version.

Both should be log pi_v(token | prefix); they differ by kernels, precision (vLLM in bf16, the trainer
in fp32), batch shapes and sampling-time processing (a temperature the engine applied before
recording). The trainer publishes per step the mean and max |delta| and the fraction of tokens whose
|delta| exceeds ``bound``, so drift between the two is visible on the dashboard. Pure: tensors in,
sums out; the sums add across micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MismatchStats:
    """Sums over the compared tokens of a step (loss tokens whose behaviour logprob is known)."""

    bound: float = 0.0
    tokens: int = 0
    abs_sum: float = 0.0
    max_abs: float = 0.0
    beyond: int = 0  # tokens with |delta| > bound

    def add(self, other: MismatchStats) -> None:
        self.tokens += other.tokens
        self.abs_sum += other.abs_sum
        self.max_abs = max(self.max_abs, other.max_abs)
        self.beyond += other.beyond

    @property
    def mean_abs(self) -> float:
        return self.abs_sum / self.tokens if self.tokens else 0.0

    @property
    def beyond_fraction(self) -> float:
        return self.beyond / self.tokens if self.tokens else 0.0


def mismatch_stats(trainer_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, compared: torch.Tensor,
                   bound: float) -> MismatchStats:
    """|trainer - rollout| over the ``compared`` tokens (bool, same shape)."""
    if bound < 0:
        raise ValueError("the mismatch bound must be >= 0")
    with torch.no_grad():
        delta = (trainer_logprobs.detach().double() - rollout_logprobs.double()).abs()[compared]
        n = int(delta.numel())
        return MismatchStats(bound=bound, tokens=n, abs_sum=float(delta.sum()) if n else 0.0,
                             max_abs=float(delta.max()) if n else 0.0, beyond=int((delta > bound).sum()))
