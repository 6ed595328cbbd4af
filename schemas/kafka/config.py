"""The Kafka connection every client shares: its settings section and the client configurations.

``KafkaSettings`` is the ``kafka`` section of the settings (``TOKENTRAIL_KAFKA__*``); the shell composes
it and hands it to each adapter. The helpers below turn it into librdkafka and faust configurations
that agree with the topics (``schemas.topics``) on message sizes and compression.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from pydantic import BaseModel, Field

from schemas.local_paths import REPO_ROOT, VAR_DIR


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
    # min.insync.replicas of every topic (schemas/topics.py): how many replicas must have a write before
    # an acks=all producer is told it is stored. 1 suits the single local broker; on a cluster set 2 with
    # a replication factor of 3 (the broker's default.replication.factor), so one broker may fail.
    min_insync_replicas: int = Field(default=1, ge=1)
    # Security pass-through: any librdkafka settings (e.g. sasl.mechanism, ssl.ca.location)
    # applied to every client this project creates; the faust app gets the same through
    # schemas.kafka.faust_security (PLAINTEXT, SSL, SASL_PLAINTEXT / SASL_SSL with PLAIN or SCRAM).
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


# ---------------------------------------------------------------- client configuration
# librdkafka property names (confluent-kafka). KafkaSettings.client_config() carries bootstrap
# servers and any security settings; the helpers never drop them.


def producer_config(kafka: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    """An idempotent, acks=all producer whose batches may hold the largest allowed record."""
    return {
        **kafka.client_config(),
        "acks": "all",
        "enable.idempotence": True,
        "compression.type": kafka.compression,
        "message.max.bytes": kafka.max_message_bytes,
        "linger.ms": 5,
        **overrides,
    }


def consumer_config(kafka: KafkaSettings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """A manually committing, read_committed consumer that can fetch the largest allowed record."""
    # librdkafka wants fetch.max.bytes >= its message.max.bytes (1,000,000 unless set), also for small limits.
    fetch_max = max(4 * kafka.max_message_bytes, 1_000_000)
    return {
        **kafka.client_config(),
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "max.partition.fetch.bytes": kafka.max_message_bytes,
        "fetch.max.bytes": fetch_max,
        # librdkafka requires room for a whole fetch response plus protocol overhead.
        "receive.message.max.bytes": fetch_max + 1024 * 1024,
        **overrides,
    }


def raise_authentication_failure(error: KafkaError) -> None:
    """``error_cb`` of admin clients: a refused login (wrong SASL credentials, a TLS handshake the broker
    rejects) is final, so it is raised from the next ``poll`` instead of librdkafka retrying until a
    time-out that only says "transport failure". ``list_topics`` below polls for it."""
    if error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
        raise KafkaException(error)


def admin_config(kafka: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    return {**kafka.client_config(), "error_cb": raise_authentication_failure, **overrides}


def faust_app_settings(kafka: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments for ``faust.App`` that match the topics' sizes and compression, with the
    same security settings as every other client (``broker_credentials``, see schemas.kafka.faust_security;
    raises KafkaSecurityError for settings faust cannot honour).

    aiokafka (under faust) decodes zstd batches only with ``cramjam`` installed.
    """
    from schemas.kafka.faust_security import faust_credentials

    servers = [s.strip() for s in kafka.bootstrap_servers.split(",") if s.strip()]
    return {
        "broker": [f"kafka://{server}" for server in servers],
        "broker_credentials": faust_credentials(kafka.client_config()),
        "producer_acks": -1,
        "producer_compression_type": kafka.compression,
        "producer_max_request_size": kafka.max_message_bytes,
        "consumer_max_fetch_size": kafka.max_message_bytes,
        "consumer_auto_offset_reset": "earliest",
        "topic_partitions": kafka.partitions,
    }
