"""Produce and consume through the real broker with the project's client configs."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from schemas.kafka.config import consumer_config, producer_config
from schemas.topics import CALLS
from tokentrail.settings import Settings

NewTopic = Callable[..., str]  # the new_topic fixture of tests/conftest.py


def _deliver(producer: Producer, topic: str, records: list[tuple[bytes, bytes]]) -> list[Message]:
    delivered: list[Message] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        delivered.append(msg)

    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    assert producer.flush(60) == 0
    return delivered


def _consume(consumer: Consumer, expected: int, timeout_s: float = 60.0) -> list[Message]:
    received: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(received) < expected and time.monotonic() < deadline:
        for msg in consumer.consume(100, timeout=1.0):
            if msg.error():
                raise KafkaException(msg.error())
            received.append(msg)
    return received


@pytest.mark.kafka
def test_large_records_round_trip_in_key_order(
    new_topic: NewTopic, kafka_bootstrap: str, tokentrail_settings: Settings
) -> None:
    topic = new_topic(partitions=3, config=CALLS.config(tokentrail_settings.kafka))
    big = os.urandom(8 * 1024 * 1024)  # incompressible: the broker limit applies to the real size
    records = [(b"rollout-%d" % (i % 4), b"%04d" % i) for i in range(40)]
    records.insert(17, (b"rollout-1", big))

    delivered = _deliver(Producer(producer_config(tokentrail_settings.kafka)), topic, records)
    assert len(delivered) == len(records)

    group = f"test-roundtrip-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(consumer_config(tokentrail_settings.kafka, group))
    consumer.subscribe([topic])
    try:
        received = _consume(consumer, len(records))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()

    assert sorted((m.key(), m.value()) for m in received) == sorted(records)
    for key in {k for k, _ in records}:  # one key -> one partition -> produced order
        assert [m.value() for m in received if m.key() == key] == [v for k, v in records if k == key]
    assert len({m.partition() for m in received if m.key() == b"rollout-1"}) == 1

    # Offsets were committed by hand (auto commit is off): the group resumes after them.
    later = _deliver(Producer(producer_config(tokentrail_settings.kafka)), topic, [(b"rollout-2", b"after")])
    resumed = Consumer(consumer_config(tokentrail_settings.kafka, group))
    resumed.subscribe([topic])
    try:
        assert [(m.key(), m.value()) for m in _consume(resumed, 1)] == [(b"rollout-2", b"after")]
        committed = resumed.committed([TopicPartition(topic, later[0].partition())], timeout=10)
        assert committed[0].offset == later[0].offset()  # the old commit, before the new record
    finally:
        resumed.close()


@pytest.mark.kafka
def test_record_over_the_limit_is_refused(
    new_topic: NewTopic, kafka_bootstrap: str, tokentrail_settings: Settings
) -> None:
    topic = new_topic(partitions=1, config=CALLS.config(tokentrail_settings.kafka))
    producer = Producer(producer_config(tokentrail_settings.kafka))
    too_big = os.urandom(tokentrail_settings.kafka.max_message_bytes + 1)
    with pytest.raises(KafkaException) as info:
        producer.produce(topic, key=b"k", value=too_big)
    assert info.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
