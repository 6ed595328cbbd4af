"""What the controller knows about one policy version's traffic: reward and call totals, folded purely."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RewardObservation:
    """One reward of a rollout served by ``version``. ``pinned``: it came from pinned (evaluation)
    traffic, which the comparison leaves out."""

    version: int
    value: float
    pinned: bool = False


@dataclass(frozen=True)
class CallObservation:
    """One model call served by ``version``: whether it failed, and how long it took."""

    version: int
    ok: bool
    latency_ms: float
    pinned: bool = False


@dataclass(frozen=True)
class ArmStats:
    """Totals of one version since the release started (sums, so folding is exact and order-free)."""

    rewards: int = 0
    reward_total: float = 0.0
    reward_total_sq: float = 0.0
    calls: int = 0
    errors: int = 0
    latency_ms_total: float = 0.0

    def with_reward(self, value: float) -> ArmStats:
        if not math.isfinite(value):
            raise ValueError(f"a reward must be a finite number, got {value!r}")
        return replace(self, rewards=self.rewards + 1, reward_total=self.reward_total + value,
                       reward_total_sq=self.reward_total_sq + value * value)

    def with_call(self, ok: bool, latency_ms: float) -> ArmStats:
        if not (math.isfinite(latency_ms) and latency_ms >= 0):
            raise ValueError(f"a call latency must be a finite number >= 0, got {latency_ms!r}")
        return replace(self, calls=self.calls + 1, errors=self.errors + (0 if ok else 1),
                       latency_ms_total=self.latency_ms_total + latency_ms)

    @property
    def reward_mean(self) -> float | None:
        return self.reward_total / self.rewards if self.rewards else None

    @property
    def reward_variance(self) -> float | None:
        """Unbiased sample variance (None below two rewards)."""
        if self.rewards < 2:
            return None
        return max((self.reward_total_sq - self.reward_total**2 / self.rewards) / (self.rewards - 1), 0.0)

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.calls if self.calls else None

    @property
    def latency_ms_mean(self) -> float | None:
        return self.latency_ms_total / self.calls if self.calls else None

    def arrays(self) -> ArmArrays:
        return ArmArrays(*(np.asarray(float(v)) for v in (
            self.rewards, self.reward_total, self.reward_total_sq, self.calls, self.errors,
            self.latency_ms_total)))

    @classmethod
    def from_summary(cls, rewards: int, mean: float | None, variance: float | None, calls: int, errors: int,
                     latency_ms_mean: float | None) -> ArmStats:
        """Totals back from the summary a decision records (count, mean, variance)."""
        total = (mean or 0.0) * rewards
        total_sq = (variance or 0.0) * max(rewards - 1, 0) + (total * total / rewards if rewards else 0.0)
        return cls(rewards, total, total_sq, calls, errors, (latency_ms_mean or 0.0) * calls)


@dataclass(frozen=True)
class ArmArrays:
    """The same totals for many independent streams at once (the simulation), as float arrays."""

    rewards: FloatArray
    reward_total: FloatArray
    reward_total_sq: FloatArray
    calls: FloatArray
    errors: FloatArray
    latency_ms_total: FloatArray
