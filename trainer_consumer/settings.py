"""The ``trainer`` settings section (``TOKENTRAIL_TRAINER__*``), read by the trainer consumer, and
``TrainerStackSettings``: the sections ``run_training`` reads, which the shell's settings provide."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from models.settings import ModelSettings
from schemas.kafka_config import KafkaSettings
from schemas.local_paths import VAR_DIR


class TrainerSettings(BaseModel):
    group_id: str = "tokentrail-trainer"
    checkpoint_dir: Path = VAR_DIR / "policies"
    max_staleness: int = 4
    steps_per_version: int = 1
    # The tiny demo model: 1e-3 breaks its tool-call format; 3e-4 lost it late in one 8-minute demo of
    # seven; 2e-4 learned as fast (measured, demo reward 0.36 -> 0.71).
    learning_rate: float = 2e-4


class TrainerStackSettings(Protocol):
    """The settings sections a trainer runs from (``tokentrail.settings.Settings`` has them)."""

    trainer: TrainerSettings
    model: ModelSettings
    kafka: KafkaSettings
