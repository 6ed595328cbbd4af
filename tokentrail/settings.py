"""Typed settings with laptop defaults; every field can be overridden by an environment variable.

Variables are named ``TOKENTRAIL_<SECTION>__<FIELD>``, e.g. ``TOKENTRAIL_KAFKA__BOOTSTRAP_SERVERS``.
Each section is defined by the package that reads it, beside the adapter that reads it; this module
only composes them, and the shell hands each component the sections it needs.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from models.settings import ModelSettings
from processors.release.settings import ReleaseSettings
from processors.stream.settings import ProcessorSettings
from producers.gateway.settings import GatewaySettings
from schemas.kafka.config import KafkaSettings
from schemas.kafka.key_store import ForgetSettings
from schemas.local_paths import REPO_ROOT, VAR_DIR
from sinks.settings import ClickHouseSettings
from trainer_consumer.settings import TrainerSettings
from trainer_consumer.weight_sync.settings import WeightSyncSettings

__all__ = [
    "REPO_ROOT", "VAR_DIR", "ClickHouseSettings", "ForgetSettings", "GatewaySettings", "KafkaSettings", "ModelSettings",
    "ProcessorSettings", "ReleaseSettings", "Settings", "TrainerSettings", "WeightSyncSettings", "get_settings",
]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOKENTRAIL_", env_nested_delimiter="__", extra="ignore")

    var_dir: Path = VAR_DIR
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    model: ModelSettings = Field(default_factory=ModelSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    processors: ProcessorSettings = Field(default_factory=ProcessorSettings)
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    release: ReleaseSettings = Field(default_factory=ReleaseSettings)
    weight_sync: WeightSyncSettings = Field(default_factory=WeightSyncSettings)
    forget: ForgetSettings = Field(default_factory=ForgetSettings)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
