"""The trainer never trains a forgotten subject's sample (issue 31 item 4), on the real broker: a sample
whose key is gone is counted as "forgotten" when read; one read before the forget but still waiting for its
step is dropped right before the step (the stream re-reads the key store); other subjects' samples train."""

from __future__ import annotations

import uuid

import numpy as np
from confluent_kafka import Producer

from schemas.codec import Codec
from schemas.kafka import config as kafka_config
from schemas.kafka.forget_log import forget_subject, read_forgotten
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore
from schemas.sealing import Sealer
from testkit.samples import random_sequence, sample_record
from tokentrail.settings import Settings
from trainer_consumer.batching import BatchBuilder
from trainer_consumer.dataset import FORGOTTEN, SampleStream


def _samples(subject: str | None, n: int, rng: np.random.Generator) -> list[dict]:
    out = []
    for i in range(n):
        record = sample_record([random_sequence(rng, 50, 4, 3, f"{subject}-r{i}")], policy_version=1)
        record["subject"] = subject
        out.append(record)
    return out


def test_forgotten_samples_are_never_handed_to_a_step(
    tokentrail_settings: Settings, forget_settings: ForgetSettings, new_topic, sealing: KafkaKeyStore
) -> None:
    kafka = tokentrail_settings.kafka
    topic = new_topic(1)
    writer = KafkaKeyStore(kafka, forget_settings)  # the sample builder's process
    try:
        codec = Codec(sealer=Sealer(writer))
        rng = np.random.default_rng(0)
        early, late, bob, plain = _samples("alice", 2, rng), _samples("carol", 2, rng), _samples("bob", 2, rng), \
            _samples(None, 1, rng)
        producer = Producer(kafka_config.producer_config(kafka))
        for record in [*early, *late, *bob, *plain]:
            producer.produce(topic, value=codec.encode("Sample", record), key=b"k")
        assert producer.flush(30) == 0
        forget_subject(writer, kafka, forget_settings, "alice", requested_by="test")  # before the trainer reads

        stream = SampleStream(kafka_config.consumer_config(kafka, f"t-{uuid.uuid4().hex[:8]}"), topic,
                              BatchBuilder(batch_size=100), current_version=lambda: 1)
        try:
            assert stream.next_batch(idle_timeout_s=3.0, flush_partial=False) is None  # all read, none full
            # carol is forgotten while her opened samples wait for the step.
            event = forget_subject(writer, kafka, forget_settings, "carol", requested_by="test")
            batch = stream.next_batch(idle_timeout_s=0.5, flush_partial=True)
        finally:
            stream.close()
    finally:
        writer.close()
    assert batch is not None
    assert sorted(s.sample_id for s in batch.samples) == sorted(r["event_id"] for r in [*bob, *plain])
    assert batch.filtered[FORGOTTEN] == 4  # alice's at read, carol's before the step: counted, not lost
    assert len(batch.positions) == 7
    assert read_forgotten(kafka, forget_settings)["carol"]["request_id"] == event["request_id"]
