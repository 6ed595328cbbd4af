"""The residue scan of Kafka: every partition of every selected topic, from its first stored offset to its end.

Each record's key, value and headers are searched as raw bytes, and its value decoded by the codec where
it can be (``schemas.residue``). The consumer reads uncommitted data too (``read_uncommitted``): records of
aborted transactions stay in the log and are readable by such a consumer, so they count as residue. A
tombstone (no value) holds nothing. A partition is done at its end-of-partition event; one that is not done
by the time-out makes the scan incomplete (its zero is no proof).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from schemas.kafka.config import KafkaSettings, consumer_config
from schemas.residue import Matcher, Tally

STORE = "kafka"
# Every tokentrail topic, the processors' changelogs (``tokentrail-processors-...-changelog``) and prefixed
# runs' topics (``<prefix>tokentrail.calls``): their names all say tokentrail.
DEFAULT_TOPICS = "tokentrail"


@dataclass(frozen=True)
class TopicSelection:
    """Topics whose name matches ``pattern`` (``re.search``), or exactly ``names`` when given."""

    pattern: str = DEFAULT_TOPICS
    names: tuple[str, ...] = ()

    def select(self, available: list[str]) -> list[str]:
        if self.names:
            return [n for n in self.names if n in available]
        rx = re.compile(self.pattern)
        return sorted(n for n in available if rx.search(n) and not n.startswith("__"))


def scan_topics(kafka: KafkaSettings, matcher: Matcher, tally: Tally, *, selection: TopicSelection = TopicSelection(),
                timeout_s: float = 600.0, progress: Callable[[str], None] | None = None,
                progress_every_s: float = 5.0) -> None:
    consumer = Consumer(consumer_config(kafka, f"tokentrail-residue-{uuid.uuid4().hex[:12]}",
                                        **{"isolation.level": "read_uncommitted", "enable.partition.eof": True,
                                           "auto.offset.reset": "earliest"}))
    try:
        metadata = consumer.list_topics(timeout=30)
        topics = selection.select(list(metadata.topics))
        missing = [n for n in selection.names if n not in metadata.topics]
        tally.skipped += [f"topic {n} (does not exist)" for n in missing]
        pending: dict[tuple[str, int], int] = {}  # partition -> its end offset when the scan began
        assign: list[TopicPartition] = []
        for topic in topics:
            tally.count("topics")
            for partition in sorted(metadata.topics[topic].partitions):
                tally.count("partitions")
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
                if high > low:
                    pending[(topic, partition)] = high
                    assign.append(TopicPartition(topic, partition, low))
        if progress:
            progress(f"kafka: {len(topics)} topics, {tally.scanned['partitions']} partitions, "
                     f"{len(assign)} with records")
        if assign:
            consumer.assign(assign)
        _consume(consumer, pending, matcher, tally, timeout_s, progress, progress_every_s)
    finally:
        consumer.close()


def _consume(consumer: Consumer, pending: dict[tuple[str, int], int], matcher: Matcher, tally: Tally,
             timeout_s: float, progress: Callable[[str], None] | None, progress_every_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    next_report = time.monotonic() + progress_every_s
    while pending and time.monotonic() < deadline:
        for msg in consumer.consume(500, timeout=0.5):
            where = (msg.topic(), msg.partition())
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.pop(where, None)
                    continue
                tally.incomplete.append(f"kafka {where[0]}[{where[1]}]: {error.str()}")
                pending.pop(where, None)
                continue
            _scan_record(msg, matcher, tally)
            if where in pending and msg.offset() + 1 >= pending[where]:
                pending.pop(where)  # read up to where the partition ended when the scan began
        if progress and time.monotonic() >= next_report:
            next_report = time.monotonic() + progress_every_s
            progress(f"kafka: {tally.scanned['kafka_records']} records read, {len(pending)} partitions to go, "
                     f"{sum(1 for loc in tally.locations if loc.store == STORE)} with readable content")
    tally.incomplete += [f"kafka {t}[{p}]: not read to its end in {timeout_s:g} s" for t, p in sorted(pending)]


def _scan_record(msg: Message, matcher: Matcher, tally: Tally) -> None:
    tally.count("kafka_records")
    value = msg.value()
    hits = matcher.in_bytes(msg.key(), "key") + matcher.in_bytes(value, "value")
    for name, header in msg.headers() or ():
        hits += matcher.in_text(name, f"header:{name}") + matcher.in_bytes(header, f"header:{name}")
    hits += matcher.in_encoded(value, "decoded")
    tally.add(STORE, f"{msg.topic()}[{msg.partition()}]@{msg.offset()}", hits)
