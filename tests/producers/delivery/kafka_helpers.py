"""Helpers of the delivery tests: a private broker they may stop, topics, reading a topic back."""

from __future__ import annotations

import socket
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tokentrail import kafka_local
from tokentrail.settings import KafkaSettings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PrivateBroker:
    settings: KafkaSettings

    @property
    def bootstrap(self) -> str:
        return self.settings.bootstrap_servers

    def stop(self) -> None:
        kafka_local.stop(timeout_s=30, kafka=self.settings, echo=lambda _: None)

    def start(self) -> None:
        kafka_local.start(wait_s=120, kafka=self.settings, echo=lambda _: None)


def create_topic(bootstrap: str, partitions: int = 3) -> str:
    name = f"test.delivery.{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=30)
    return name


def consume_all(
    bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0
) -> list[tuple[bytes, bytes]]:
    """(key, value) of every record on ``topic`` from the beginning, per partition in offset order.

    Reads until ``expected`` records arrived and then two more seconds (to see any extra copy).
    """
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    partitions = sorted(metadata.topics[topic].partitions)
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"test-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    records: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    settle_until: float | None = None
    try:
        while time.monotonic() < deadline and (settle_until is None or time.monotonic() < settle_until):
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error():
                    continue
                records.append((msg.key(), msg.value()))
            if settle_until is None and len(records) >= expected:
                settle_until = time.monotonic() + 2.0
    finally:
        consumer.close()
    return records
