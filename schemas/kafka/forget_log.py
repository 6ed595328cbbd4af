"""Forgetting a subject on Kafka: destroy its keys in the key store of record, then put the immutable
``Forgotten`` event on its topic (issue 31). Shared by ``tokentrail forget`` and the gateway's admin route;
what else holds content (ClickHouse, a gateway's spool and caches) is cleared by its owner."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from schemas.codec import Codec, get_codec
from schemas.forget_events import Record, forgotten_event, new_request_id
from schemas.kafka.config import KafkaSettings, admin_config, consumer_config, producer_config
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore
from schemas.kafka.topic_admin import ensure_topics
from schemas.subject_names import SubjectNames
from schemas.topics import FORGOTTEN


def _now_us() -> int:
    return time.time_ns() // 1000


def forget_subject(store: KafkaKeyStore, kafka: KafkaSettings, settings: ForgetSettings, subject: str, *,
                   requested_by: str, reason: str = "", request_id: str | None = None,
                   codec: Codec | None = None) -> Record:
    """Tombstone the subject's keys (flushed), then publish its Forgotten event (flushed); the event."""
    requested_at = _now_us()
    key_ids = store.destroy(subject)
    record = forgotten_event(request_id=request_id or new_request_id(), subject=subject,
                             requested_by=requested_by, reason=reason, key_ids=key_ids,
                             requested_at_us=requested_at, created_at_us=_now_us())
    publish_forgotten(kafka, settings, record, codec)
    return record


def forget_name(store: KafkaKeyStore, kafka: KafkaSettings, settings: ForgetSettings, name: str, *,
                requested_by: str, reason: str = "", request_id: str | None = None,
                codec: Codec | None = None) -> list[Record]:
    """Forget whoever ``name`` names (what ``tokentrail forget --subject`` and ``POST /v1/admin/forget`` are
    given): its pseudonym, which records carry (schemas/subject_names.py), always; and the name as given where
    keys of it exist (records written before subjects were pseudonymised, or a pseudonym read from
    ClickHouse). Each form forgotten gets its own Forgotten event, so every sink blanks its rows; the name
    as given is written to the forgotten topic only when its own records already carry it. The events,
    the pseudonym's first."""
    forms = SubjectNames(settings.master()).forms(name)
    request_id = request_id or new_request_id()
    events = [forget_subject(store, kafka, settings, forms[0], requested_by=requested_by, reason=reason,
                             request_id=request_id, codec=codec)]
    for n, older in enumerate(forms[1:], 1):
        if store.key_ids(older):
            events.append(forget_subject(store, kafka, settings, older, requested_by=requested_by, reason=reason,
                                         request_id=f"{request_id}.{n}", codec=codec))
    return events


def publish_forgotten(kafka: KafkaSettings, settings: ForgetSettings, record: Record,
                      codec: Codec | None = None) -> None:
    ensure_topics(AdminClient(admin_config(kafka)), kafka, (replace(FORGOTTEN, name=settings.forgotten_topic),))
    producer = Producer(producer_config(kafka, **{"linger.ms": 0}))
    errors: list[str] = []
    producer.produce(settings.forgotten_topic, key=record["subject"].encode(),
                     value=(codec or get_codec()).encode("Forgotten", record),
                     on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
    left = producer.flush(30)
    if left or errors:
        raise RuntimeError(f"the Forgotten event of {record['subject']!r} was not stored: {errors or left}")


def read_forgotten(kafka: KafkaSettings, settings: ForgetSettings, codec: Codec | None = None,
                   timeout_s: float = 30.0) -> dict[str, Record]:
    """Every Forgotten event on the topic, by subject (the latest request per subject)."""
    codec = codec or get_codec()
    consumer = Consumer(consumer_config(kafka, f"tokentrail-forgotten-{uuid.uuid4().hex[:12]}",
                                        **{"enable.partition.eof": False}))
    out: dict[str, Record] = {}
    try:
        meta = consumer.list_topics(settings.forgotten_topic, timeout=10).topics.get(settings.forgotten_topic)
        if meta is None or meta.error is not None:
            return out
        ends = {p: consumer.get_watermark_offsets(TopicPartition(settings.forgotten_topic, p), timeout=10)[1]
                for p in meta.partitions}
        ends = {p: e for p, e in ends.items() if e > 0}
        consumer.assign([TopicPartition(settings.forgotten_topic, p, OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() is not None:
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"reading {settings.forgotten_topic}: {msg.error()}")
                    continue
                _, record = codec.decode(msg.value(), expect="Forgotten", topic=msg.topic(),
                                         partition=msg.partition(), offset=msg.offset())
                out[record["subject"]] = record
                if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                    ends.pop(msg.partition(), None)
        if ends:
            raise RuntimeError(f"{settings.forgotten_topic} could not be read to its end in {timeout_s:.0f} s")
        return out
    finally:
        consumer.close()
