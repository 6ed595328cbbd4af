"""The ``trainer`` settings section (``TOKENTRAIL_TRAINER__*``), read by the trainer consumer, and
``TrainerStackSettings``: the sections ``run_training`` reads, which the shell's settings provide."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from models.settings import ModelSettings
from schemas.kafka.config import KafkaSettings
from schemas.local_paths import VAR_DIR
from trainer_consumer.staleness import DEFAULT_MAX_STALENESS


class TrainerSettings(BaseModel):
    group_id: str = "tokentrail-trainer"
    # The samples reader's Kafka session (session.timeout.ms): a trainer killed without leaving the group
    # holds its partitions this long, so a restarted one waits at most this for them (librdkafka's default,
    # 45 s, is most of a short run). The broker's group.min.session.timeout.ms (6 s by default) is the floor.
    session_timeout_s: float = Field(default=10.0, ge=6.0)
    checkpoint_dir: Path = VAR_DIR / "policies"
    max_staleness: int = DEFAULT_MAX_STALENESS
    # What the bound does to a sample with loss tokens older than current - max_staleness
    # (trainer_consumer/staleness.py): "drop" the sample, or "mask" only its stale tokens.
    stale_rule: Literal["drop", "mask"] = "drop"
    # Engine/trainer logprob mismatch correction (trainer_consumer/losses.py): "auto" is "tis" behind
    # vLLM (its kernels and bf16 differ from the trainer's) and "none" behind the embedded engine,
    # which runs the trainer's own transformers code.
    importance_sampling: Literal["auto", "none", "tis", "mis"] = "auto"
    importance_cap: float = 2.0  # TIS truncates the weight here; MIS masks tokens outside [1/cap, cap]
    mismatch_bound: float = 0.2  # |trainer - engine| logprob above this counts as beyond the bound
    # Older behaviour versions' weights kept in memory to recompute the engine's logprobs (0: compare
    # only the samples sampled by the trainer's current weights, from the step's own forward pass).
    behaviour_cache_versions: int = 2
    steps_per_version: int = 1
    # The tiny demo model: 1e-3 breaks its tool-call format; 3e-4 lost it late in one 8-minute demo of
    # seven; 2e-4 learned as fast (measured, demo reward 0.36 -> 0.71).
    learning_rate: float = 2e-4
    # Publish each version with its deltas against the version before (models/policy_delta.py): the changed
    # weight groups, and the changed elements in `engine_dtype` (what the engines serve: float32 for the
    # reference model, bfloat16 for a 7B/8B vLLM), for weight_sync.transfer "scatter" (the default) / "elements" /
    # "delta". On by default: without it the default scatter has nothing to scatter and every update falls back
    # to a full load. It costs the trainer a hash and an encode of what changed per published version (measured
    # on the demo model, 0.46M parameters: publish 27 -> 60 ms per version; docs/weight-sync.md "Settings").
    publish_delta: bool = True
    engine_dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class TrainerStackSettings(Protocol):
    """The settings sections a trainer runs from (``tokentrail.settings.Settings`` has them)."""

    trainer: TrainerSettings
    model: ModelSettings
    kafka: KafkaSettings


def resolve_importance_sampling(setting: str, upstream: str) -> Literal["none", "tis", "mis"]:
    """The correction a trainer runs with: ``auto`` decided by the engine upstream (the shell knows it)."""
    if setting == "auto":
        return "tis" if upstream == "vllm" else "none"
    if setting not in ("none", "tis", "mis"):
        raise ValueError(f"unknown importance_sampling {setting!r}")
    return setting  # type: ignore[return-value]


class TrainerRunSettings(BaseSettings):
    """The sections a trainer rank runs from, read from the same ``TOKENTRAIL_*`` environment as the shell's
    settings: what ``python -m trainer_consumer`` (started by torchrun, below the shell) uses."""

    model_config = SettingsConfigDict(env_prefix="TOKENTRAIL_", env_nested_delimiter="__", extra="ignore")

    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    model: ModelSettings = Field(default_factory=ModelSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
