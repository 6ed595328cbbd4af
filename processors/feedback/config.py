"""The feedback-reward configuration: how long to wait for each kind of feedback, how to combine several,
what a rollout with none gets. Loaded like the reward and credit configurations (``processors.config``);
its id is the content hash of the normalized content, so every feedback reward names the rules it used."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from processors.config import config_id, load_config
from schemas.feedback import KINDS

FeedbackKind = Literal["BINARY", "RATING", "OUTCOME", "TASK_OUTCOME", "TEXT"]
US_PER_S = 1_000_000


class FeedbackValues(BaseModel):
    """The number each feedback stands for (TEXT stands for none: it is recorded, never averaged)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    binary_true: float = 1.0
    binary_false: float = 0.0
    accepted: float = 1.0
    rejected: float = 0.0
    # EDITED: accepted - (accepted - rejected) * edit_distance when true, else the fixed ``edited``.
    edited_by_distance: bool = True
    edited: float = 0.5
    task_success: float = 1.0
    task_failure: float = 0.0
    # RATING is mapped linearly from its own scale [rating_min, rating_max] onto [rating_low, rating_high].
    rating_low: float = 0.0
    rating_high: float = 1.0


class FeedbackRewardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1  # configuration format version
    name: str = "feedback-default"
    # How long after a rollout closes each kind of feedback still counts (event time, seconds). The
    # rollout's window closes once the watermark passes its close time + the longest of these.
    wait_s: dict[FeedbackKind, float] = Field(default_factory=lambda: dict.fromkeys(KINDS, 3600.0))
    watermark_lag_s: float = Field(default=60.0, ge=0)  # how far out of event-time order inputs may arrive
    match_wait_s: float = Field(default=86_400.0, ge=0)  # how long feedback waits for what it names
    closed_retention_s: float = Field(default=7 * 86_400.0, ge=0)  # closed rollouts remembered for late ones
    combine: Literal["latest", "mean", "first_terminal", "weighted"] = "latest"
    terminal_kinds: tuple[FeedbackKind, ...] = ("OUTCOME", "TASK_OUTCOME")
    weights: dict[FeedbackKind, float] = Field(default_factory=dict)  # for ``weighted``
    supersede: Literal["replace", "keep"] = "replace"  # replace: a revision drops what it supersedes
    missing: Literal["exclude", "default"] = "exclude"  # a rollout without a usable value
    default: float = 0.0
    values: FeedbackValues = FeedbackValues()

    @model_validator(mode="after")
    def _check(self) -> FeedbackRewardConfig:
        missing_waits = [k for k in KINDS if k not in self.wait_s]
        if missing_waits:
            raise ValueError(f"wait_s needs every kind; missing {missing_waits}")
        if any(w < 0 for w in self.wait_s.values()):
            raise ValueError("wait_s values must be >= 0")
        if self.combine == "weighted" and not any(w > 0 for w in self.weights.values()):
            raise ValueError("combine: weighted needs weights with at least one kind above 0")
        if any(w < 0 for w in self.weights.values()):
            raise ValueError("weights must be >= 0")
        if self.combine == "first_terminal" and not self.terminal_kinds:
            raise ValueError("combine: first_terminal needs terminal_kinds")
        return self

    @property
    def id(self) -> str:
        return config_id(self)

    def wait_us(self, kind: str) -> int:
        return round(self.wait_s[kind] * US_PER_S)  # type: ignore[index]

    @property
    def window_us(self) -> int:
        """How long after a rollout closes its window stays open: the longest wait of any kind."""
        return max(self.wait_us(k) for k in KINDS)

    @property
    def lag_us(self) -> int:
        return round(self.watermark_lag_s * US_PER_S)

    @property
    def match_wait_us(self) -> int:
        return round(self.match_wait_s * US_PER_S)

    @property
    def retention_us(self) -> int:
        return round(self.closed_retention_s * US_PER_S)


def load_feedback_config(source: str | Path | dict[str, Any] | FeedbackRewardConfig) -> FeedbackRewardConfig:
    """From a YAML path (e.g. deploy/config/feedback_reward.yaml), YAML text, a mapping or a config."""
    return load_config(FeedbackRewardConfig, source)
