"""Read a topic back from the beginning and count event ids (for lost / duplicated accounting)."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from schemas.codec import DecodeError, get_codec
from schemas.kafka.config import KafkaSettings, consumer_config


def count_event_ids(config: dict[str, Any], topics: list[str], expected: set[str], *, timeout_s: float = 60.0,
                    settle_s: float = 2.0) -> Counter[str]:
    """Event id -> copies on ``topics``; reads until every expected id is seen, then ``settle_s`` more
    (to see any extra copy), or until ``timeout_s``."""
    records = read_records(config, topics, expected, timeout_s=timeout_s, settle_s=settle_s)
    return Counter(record.get("event_id", "<undecodable>") for _, record in records)


def read_records(config: dict[str, Any], topics: list[str], expected: set[str], *, timeout_s: float = 60.0,
                 settle_s: float = 2.0) -> list[tuple[bytes, dict[str, Any]]]:
    """(raw value, decoded record) of every record on ``topics``, read from the beginning until every
    expected event id is seen, then ``settle_s`` more, or until ``timeout_s``; undecodable values come
    back with an empty record."""
    consumer = Consumer({**config, "group.id": f"reliability-read-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    codec = get_codec()
    found: list[tuple[bytes, dict[str, Any]]] = []
    seen: set[str] = set()
    try:
        metadata = consumer.list_topics(timeout=30)
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics
                         for p in metadata.topics[t].partitions])
        deadline = time.monotonic() + timeout_s
        settle_until: float | None = None
        while time.monotonic() < deadline and (settle_until is None or time.monotonic() < settle_until):
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error():
                    continue
                try:
                    record = codec.decode(msg.value())[1]
                except DecodeError:
                    record = {}
                found.append((msg.value(), record))
                seen.add(record.get("event_id", ""))
            if settle_until is None and expected <= seen:
                settle_until = time.monotonic() + settle_s
    finally:
        consumer.close()
    return found


def lost_and_duplicated(counts: Counter[str], expected: set[str]) -> tuple[int, int]:
    lost = len(expected - set(counts))
    duplicated = sum(counts[i] - 1 for i in expected if counts[i] > 1)
    return lost, duplicated


def create_topics(config: dict[str, Any], names: list[str], partitions: int = 2) -> None:
    admin = AdminClient(config)
    for future in admin.create_topics([NewTopic(n, partitions, 1) for n in names], operation_timeout=30).values():
        future.result(timeout=60)


def delete_topics(config: dict[str, Any], names: list[str]) -> None:
    admin = AdminClient(config)
    for future in admin.delete_topics(names, operation_timeout=30).values():
        try:
            future.result(timeout=60)
        except Exception:  # already gone
            pass


def delete_topics_by_prefix(config: dict[str, Any], prefixes: Iterable[str]) -> None:
    """Delete every topic whose name starts with one of ``prefixes`` (a run's own topics and its app's
    changelogs)."""
    names = [t for t in AdminClient(config).list_topics(timeout=30).topics if t.startswith(tuple(prefixes))]
    if names:
        delete_topics(config, names)


def first_records(kafka: KafkaSettings, topic: str, count: int, *,
                  where: Callable[[str, dict[str, Any]], bool] | None = None,
                  timeout_s: float = 60.0) -> list[tuple[str, dict[str, Any]]]:
    """The first ``count`` records of ``topic`` that ``where(schema name, record)`` accepts, read from the
    beginning by a throwaway consumer group, as (schema name, record); fewer when ``timeout_s`` passes."""
    consumer = Consumer({**consumer_config(kafka, f"read-{uuid.uuid4().hex}"), "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    codec = get_codec()
    found: list[tuple[str, dict[str, Any]]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            name, record = codec.decode(msg.value(), topic=msg.topic(), partition=msg.partition(),
                                        offset=msg.offset())
            if where is None or where(name, record):
                found.append((name, record))
    finally:
        consumer.close()
    return found
