"""The baseline configuration: how production rollouts without resampled siblings get a baseline.

Versioned like the reward and credit configurations: its id is the content hash of the normalized
content, and every Baseline event, and every reward derived against one, names it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from processors.config import config_id

BUILTIN_CLUSTER = "processors.baselines.keys:message_template"


class KeySpec(BaseModel):
    """What makes rollouts comparable: one grouping key per rollout.

    * ``field``: a dotted path into the rollout, read from ``group_key``, ``task_input`` (the parsed
      ``task_input_json``) or ``metadata`` (the parsed ``metadata_json``), e.g. ``task_input.repository``
      or ``group_key.template``.
    * ``first_user_message``: a function ``module:function`` (or ``module.function``) of the text of the
      attempt's first user message that returns a cluster id; the built-in is a template signature
      (numbers, quoted strings, paths and URLs replaced by placeholders, first words kept).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    by: Literal["field", "first_user_message"] = "first_user_message"
    field: str = "task_input.template"
    function: str = BUILTIN_CLUSTER
    # A rollout the key cannot be computed for: "none" puts it under the key "none", "skip" leaves it out.
    missing: Literal["none", "skip"] = "none"


class WindowSpec(BaseModel):
    """Event-time windows over each key's rollouts (a rollout's event time is when it completed).

    * ``tumbling``: windows ``[k*size, (k+1)*size)``; each closes when the watermark passes its end, and its
      rollouts are one group.
    * ``sliding``: each rollout's group is the key's rollouts within ``size_s / 2`` of its own event time
      (itself included); it closes when the watermark passes its event time + ``size_s / 2``. Every rollout
      still gets exactly one advantage.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tumbling", "sliding"] = "tumbling"
    size_s: float = Field(default=600.0, gt=0)

    @property
    def size_us(self) -> int:
        return round(self.size_s * 1e6)


class GroupBaseline(BaseModel):
    """A group large enough: each advantage against the group's mean (``mean``) or the others' mean
    (``leave_one_out``), optionally divided by the group's standard deviation + eps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    baseline: Literal["mean", "leave_one_out"] = "leave_one_out"
    scale_by_std: bool = False
    eps: float = Field(default=1e-6, ge=0)


class RunningBaseline(BaseModel):
    """A group too small: each advantage against the key's running baseline as it stood before the window.

    * ``ewma``: exponentially weighted mean of the key's earlier rewards (``alpha`` per reward).
    * ``window``: the mean of the key's ``last_n`` earlier rewards.
    ``prior_mean`` (None: none) stands in before the key has ``min_history`` rewards; without it such a
    window's rewards are recorded with no advantage (reason ``no_baseline_yet``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["ewma", "window"] = "ewma"
    alpha: float = Field(default=0.1, gt=0, le=1)
    last_n: int = Field(default=50, ge=1)
    min_history: int = Field(default=1, ge=1)
    prior_mean: float | None = None


class BaselineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    name: str = "default"
    key: KeySpec = KeySpec()
    window: WindowSpec = WindowSpec()
    min_group_size: int = Field(default=4, ge=2)
    group: GroupBaseline = GroupBaseline()
    running: RunningBaseline = RunningBaseline()
    watermark_lag_s: float = Field(default=60.0, ge=0)  # inputs may arrive this far out of event-time order
    # Which rewards the baselines read: feedback rewards (``"source": "feedback"``); ``reward_config_id``
    # narrows them to one feedback configuration (None: any).
    reward_config_id: str | None = None
    clip: tuple[float, float] | None = None
    skip_zero_advantage: bool = True  # an advantage of exactly 0 teaches nothing: no credit, no samples

    @model_validator(mode="after")
    def _check(self) -> BaselineConfig:
        if self.clip is not None and not self.clip[0] < self.clip[1]:
            raise ValueError(f"clip must be [low, high] with low < high, got {list(self.clip)}")
        return self

    @property
    def id(self) -> str:
        return config_id(self)

    @property
    def lag_us(self) -> int:
        return round(self.watermark_lag_s * 1e6)
