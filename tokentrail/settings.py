"""Typed settings with laptop defaults; every field can be overridden by an environment variable.

Variables are named ``TOKENTRAIL_<SECTION>__<FIELD>``, e.g. ``TOKENTRAIL_KAFKA__BOOTSTRAP_SERVERS``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent
# Everything a local run writes (Kafka data, chDB, models, spool, policies, logs) lives under one
# folder; TOKENTRAIL_VAR_DIR moves all of it at once (a second local stack, or a test's own stack).
VAR_DIR = Path(os.environ.get("TOKENTRAIL_VAR_DIR", REPO_ROOT / "var")).resolve()


class KafkaSettings(BaseModel):
    bootstrap_servers: str = "127.0.0.1:9092"
    controller_port: int = 9093
    # Where the local broker keeps its data and logs (``tokentrail kafka start``).
    data_dir: Path = VAR_DIR / "kafka"
    lib_dir: Path = REPO_ROOT / "deploy" / "kafka" / "lib"
    heap: str = "1G"
    # Raised together on broker, topics, producer and consumer (128k-token prompts fit easily).
    max_message_bytes: int = 16 * 1024 * 1024
    compression: str = "zstd"
    partitions: int = 6
    # Security pass-through: any librdkafka settings (e.g. sasl.mechanism, ssl.ca.location)
    # applied to every client this project creates; the faust app gets the same through
    # schemas.faust_security (PLAINTEXT, SSL, SASL_PLAINTEXT / SASL_SSL with PLAIN or SCRAM).
    security_protocol: str = "PLAINTEXT"
    extra_client_config: dict[str, str] = Field(default_factory=dict)
    # Extra server.properties for a broker started by `tokentrail kafka start` (e.g. SASL users),
    # applied after the keys derived from these settings; the client listener takes security_protocol.
    broker_properties: dict[str, str] = Field(default_factory=dict)
    # Empty: Avro single-object encoding resolved against schemas/. Set: Confluent wire format.
    schema_registry_url: str = ""

    def client_config(self) -> dict[str, str]:
        conf = {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.security_protocol}
        conf.update(self.extra_client_config)
        return conf


class ClickHouseSettings(BaseModel):
    # chdb:///abs/path (embedded, default) or http(s)://host:8123 (server).
    dsn: str = f"chdb://{VAR_DIR / 'clickhouse'}"
    database: str = "tokentrail"
    username: str = "default"
    password: str = ""
    readonly_user: str = "tokentrail_dashboards"


class ModelSettings(BaseModel):
    # The embedded reference model (built locally, random weights; `tokentrail model build`).
    dir: Path = VAR_DIR / "models" / "tiny-chat"
    name: str = "tokentrail-tiny"


class GatewaySettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = 8400
    # "embedded" or a vLLM base URL list, comma separated (rollout-sticky routing).
    upstream: str = "embedded"
    # vLLM upstream: served model name (empty: the first of /v1/models), the server's --logprobs-mode
    # (raw_logprobs | processed_logprobs; recorded on every call) and its API key.
    vllm_model: str = ""
    # Harness model names mapped to the served model (Claude Code sends its own names; "*" maps all).
    model_aliases: dict[str, str] = Field(default_factory=dict)
    vllm_logprobs_mode: str = "raw_logprobs"
    vllm_api_key: str = ""
    spool_dir: Path = VAR_DIR / "spool"
    # "record": calls with no rollout are recorded as unattributed; "refuse": 400.
    unattributed: str = "record"
    # "splice": reuse exact sampled ids of earlier outputs; "retokenize": render history from text;
    # "upstream": pass-through, the upstream (vLLM, or the embedded engine) renders chats itself and the
    # gateway records the prompt ids it reports.
    prefix_mode: Literal["splice", "retokenize", "upstream"] = "splice"
    # Tokenize ASCII text with the exact fast path (producers/ascii_encoder.py) where the tokenizer
    # qualifies; false: always with the tokenizer itself (same ids, about 5x the CPU).
    fast_ascii_tokenize: bool = True
    max_body_bytes: int = 8 * 1024 * 1024
    max_tokens_limit: int = 4096
    admin_key: str = ""
    require_auth: bool = False
    delivery_timeout_s: float = 5.0


class ProcessorSettings(BaseModel):
    app_id: str = "tokentrail-processors"
    attempt_timeout_s: float = 120.0
    group_window_s: float = 60.0
    group_grace_s: float = 10.0
    reward_config: Path = REPO_ROOT / "deploy" / "config" / "reward.yaml"
    credit_config: Path = REPO_ROOT / "deploy" / "config" / "credit.yaml"
    sample_config: Path = REPO_ROOT / "deploy" / "config" / "sample.yaml"
    verifiers: list[str] = Field(default_factory=lambda: ["processors.verifiers.answer_match:AnswerMatch"])
    state_dir: Path = VAR_DIR / "processors"
    # Static group membership (Kafka group.instance.id), unique per running worker; "{hostname}" is
    # replaced by the host name (a StatefulSet pod's name, a container's id). Empty: dynamic membership.
    instance_id: str = ""


class TrainerSettings(BaseModel):
    group_id: str = "tokentrail-trainer"
    checkpoint_dir: Path = VAR_DIR / "policies"
    max_staleness: int = 4
    steps_per_version: int = 1
    # The tiny demo model: 1e-3 breaks its tool-call format; 3e-4 lost it late in one 8-minute demo of
    # seven; 2e-4 learned as fast (measured, demo reward 0.36 -> 0.71).
    learning_rate: float = 2e-4


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOKENTRAIL_", env_nested_delimiter="__", extra="ignore")

    var_dir: Path = VAR_DIR
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    model: ModelSettings = Field(default_factory=ModelSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    processors: ProcessorSettings = Field(default_factory=ProcessorSettings)
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
