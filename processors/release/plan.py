"""The release plan: a versioned configuration of how a candidate policy version reaches all traffic.

Loaded like the reward and credit configurations (``processors.config``): from ``deploy/config/
release.yaml``, YAML text or a mapping, with clear errors; its id is the content hash of the normalized
content, and every ReleaseDecision names it. The versions themselves (serving, candidate) are not part
of the plan: they are given when a release starts and recorded in its decisions.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from processors.config import config_id, load_config


class RewardRule(BaseModel):
    """The reward comparison: an always-valid confidence sequence for candidate minus serving mean
    (``processors.release.sequential``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Promote when the interval's lower end (at level alpha_promote) is above -promotion_margin:
    # 0 asks the candidate to be better; a positive margin accepts "not worse by more than this".
    promotion_margin: float = Field(default=0.0, ge=0)
    # Roll back when the interval's upper end (at level alpha_rollback / 2) is below -rollback_margin.
    rollback_margin: float = Field(default=0.0, ge=0)
    # Mixture scale (reward units): the effect size the sequence detects soonest.
    tau: float = Field(default=0.05, gt=0)
    # Each arm's variance estimate is at least this (rewards that happen to be all equal).
    variance_floor: float = Field(default=1e-4, ge=0)


class GuardRails(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min_samples_per_arm: int = Field(default=100, ge=2)  # rewards per arm before any automatic decision
    min_samples_per_stage: int = Field(default=100, ge=1)  # candidate rewards in a stage before ramping on
    min_calls_per_arm: int = Field(default=100, ge=1)  # calls per arm before the error and latency rules
    # False-promotion and false-rollback probabilities. alpha_rollback is split evenly between the
    # reward rule and the error-rate rule, so both together roll back a fine candidate at most this often.
    alpha_promote: float = Field(default=0.05, gt=0, lt=1)
    alpha_rollback: float = Field(default=0.05, gt=0, lt=1)
    # Roll back when the candidate's error rate exceeds serving's by more than this (the interval's
    # lower end, so only with confidence).
    max_error_rate_diff: float = Field(default=0.02, ge=0, le=1)
    # Roll back when the candidate's mean call latency is more than this multiple of serving's
    # (a point estimate after min_calls_per_arm: a guard, not an error-controlled test).
    max_latency_ratio: float = Field(default=1.5, gt=1)
    error_tau: float = Field(default=0.02, gt=0)  # mixture scale of the error-rate sequence


class ReleasePlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(default=1, ge=1, le=1)  # configuration format version
    name: str = "default"
    # The candidate's share of (unpinned) sessions at each stage, strictly increasing in (0, 1);
    # promotion after the last stage gives it all traffic (the 100% step).
    ramp: tuple[float, ...] = Field(default=(0.05, 0.25, 0.5), min_length=1)
    # Traffic labels (evaluation suites, internal users) routed to a fixed policy version whatever the
    # ramp; their observations are not part of the comparison.
    pinned: dict[str, int] = Field(default_factory=dict)
    reward: RewardRule = RewardRule()
    guard_rails: GuardRails = GuardRails()

    @field_validator("ramp")
    @classmethod
    def _increasing_fractions(cls, ramp: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0.0 < f < 1.0 for f in ramp):
            raise ValueError("every ramp fraction must lie strictly between 0 and 1 (promotion is the 100% step)")
        if any(b <= a for a, b in pairwise(ramp)):
            raise ValueError("ramp fractions must be strictly increasing")
        return ramp

    @field_validator("pinned")
    @classmethod
    def _labelled_versions(cls, pinned: dict[str, int]) -> dict[str, int]:
        for label, version in pinned.items():
            if not label:
                raise ValueError("a pinned traffic label must not be empty")
            if version < 0:
                raise ValueError(f"pinned version for {label!r} must be >= 0, got {version}")
        return pinned

    @property
    def plan_id(self) -> str:
        return config_id(self)


def load_plan(source: str | Path | dict[str, Any] | ReleasePlan) -> ReleasePlan:
    """A plan from a YAML file path, YAML text, a mapping or a plan (ConfigError on anything invalid)."""
    return load_config(ReleasePlan, source)
