from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from models.policy_store import PolicyStore
from schemas.codec import get_codec
from schemas.kafka import config as kafka_config
from testkit.samples import random_sequence, sample_record
from trainer_consumer.trainer import TrainOptions, run_training

from .helpers import VOCAB, make_tiny_model

START_VERSION = 10


def _read_all(settings, topic: str, expect: int, timeout_s: float = 30.0) -> list[dict]:
    """Reads a one-partition topic from the start (assigned, so no group join to wait for)."""
    consumer = Consumer(kafka_config.consumer_config(settings.kafka, f"test-read-{uuid.uuid4().hex}"))
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[dict] = []
    codec = get_codec()
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < expect and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=100, timeout=1.0):
                if msg.error() is None:
                    out.append(codec.decode(msg.value(), topic=topic)[1])
    finally:
        consumer.close()
    return out


def _committed(settings, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(kafka_config.consumer_config(settings.kafka, group))
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


def _produce(settings, topic: str, records: list[tuple[int | None, bytes]]) -> None:
    producer = Producer(kafka_config.producer_config(settings.kafka))
    for partition, value in records:
        kwargs = {"partition": partition} if partition is not None else {}
        producer.produce(topic, value=value, key=uuid.uuid4().hex.encode(), **kwargs)
    assert producer.flush(30) == 0


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    make_tiny_model().save_pretrained(path)
    return path


def test_trains_two_steps_commits_offsets_and_emits_trainer_steps(
        kafka_bootstrap, tokentrail_settings, new_topic, tmp_path, tiny_model_dir) -> None:
    settings = tokentrail_settings
    samples_topic, steps_topic, dead_topic = new_topic(3), new_topic(1), new_topic(1)
    store = PolicyStore(tmp_path / "policies")
    # The fresh samples' behaviour version is in the store too: the trainer re-scores them under it.
    store.publish(START_VERSION - 1, make_tiny_model().state_dict(), {"run_id": "someone-else", "step": 98})
    store.publish(START_VERSION, make_tiny_model().state_dict(), {"run_id": "someone-else", "step": 99})

    codec = get_codec()
    rng = np.random.default_rng(0)
    fresh = [sample_record([random_sequence(rng, VOCAB, 6, 4, f"r{i}")], policy_version=START_VERSION - 1)
             for i in range(8)]
    stale = sample_record([random_sequence(rng, VOCAB, 6, 4, "old")], policy_version=START_VERSION - 5)
    foreign = sample_record([random_sequence(rng, 10 * VOCAB, 6, 4, "foreign")], policy_version=START_VERSION)
    # Filtered and undecodable records go first on partition 0, so training on all eight fresh
    # samples has to read past them.
    _produce(settings, samples_topic,
             [(0, codec.encode("Sample", stale)), (0, b"this is not avro"),
              (0, codec.encode("Sample", foreign))]
             + [(i % 3, codec.encode("Sample", r)) for i, r in enumerate(fresh)])

    group = f"test-trainer-{uuid.uuid4().hex[:8]}"
    options = TrainOptions(max_steps=2, batch_size=4, idle_timeout_s=2.0, group_id=group, run_id="run-a",
                           steps_per_version=1, model_dir=tiny_model_dir, checkpoint_dir=store.root,
                           samples_topic=samples_topic, steps_topic=steps_topic, dead_letter_topic=dead_topic)
    lines: list[str] = []
    summary = run_training(settings, options, progress=lines.append)

    assert summary.steps == 2 and summary.stopped == "max_steps"
    assert summary.samples == 8 and summary.tokens == 80
    assert summary.versions_published == [START_VERSION + 1, START_VERSION + 2]
    assert dict(summary.filtered) == {"stale": 1, "decode_error:CorruptRecord": 1, "token_id_out_of_vocab": 1}
    # Every record of the three partitions is accounted for and committed after its step.
    assert _committed(settings, group, samples_topic, 3) == {0: 6, 1: 3, 2: 2}

    events = _read_all(settings, steps_topic, expect=2)
    assert [e["step"] for e in events] == [1, 2]
    assert [(e["policy_version_before"], e["policy_version_after"]) for e in events] == [
        (START_VERSION, START_VERSION + 1), (START_VERSION + 1, START_VERSION + 2)]
    assert sorted(sid for e in events for sid in e["sample_ids"]) == sorted(r["event_id"] for r in fresh)
    assert all(e["tokens"] == 40 and e["run_id"] == "run-a" for e in events)
    totals: dict[str, int] = {}
    for e in events:
        for reason, n in orjson.loads(e["filtered_json"]).items():
            totals[reason] = totals.get(reason, 0) + n
    assert totals == {"stale": 1, "decode_error:CorruptRecord": 1, "token_id_out_of_vocab": 1}
    assert len({e["event_id"] for e in events}) == 2
    # Issue 19: the stale sample is named, and every sampled token was compared with the engine's
    # (random, here) logprob under version START_VERSION - 1; the embedded upstream runs no correction.
    assert [sid for e in events for sid in e["stale_dropped_ids"]] == [stale["event_id"]]
    assert all(e["max_staleness"] == 4 and e["stale_rule"] == "drop" for e in events)
    assert [e["mismatch_tokens"] for e in events] == [16, 16]
    assert all(e["mismatch_mean_abs"] > 0 and e["mismatch_max_abs"] >= e["mismatch_mean_abs"] for e in events)
    assert all(e["importance_sampling"] == "none" and e["importance_truncated"] == 0 for e in events)
    assert any("mismatch" in line for line in lines)

    dead = _read_all(settings, dead_topic, expect=1)
    assert len(dead) == 1 and dead[0]["stage"] == "trainer" and dead[0]["error_type"] == "CorruptRecord"
    assert dead[0]["source_topic"] == samples_topic and dead[0]["partition"] == 0 and dead[0]["offset"] == 1

    assert store.latest_version() == START_VERSION + 2
    meta = store.info(START_VERSION + 2).metadata
    assert meta["run_id"] == "run-a" and meta["step"] == 2
    assert meta["consumed"] == [[samples_topic, 0, 6], [samples_topic, 1, 3], [samples_topic, 2, 2]]
    assert any("filtered" in line for line in lines)

    # A crash after publishing but before committing leaves the group's offsets behind the
    # weights: simulate it by rewinding them. The restart skips to the offsets kept with the
    # policy instead of training those samples a second time.
    rewind = Consumer(kafka_config.consumer_config(settings.kafka, group))
    rewind.commit(offsets=[TopicPartition(samples_topic, p, 0) for p in range(3)], asynchronous=False)
    rewind.close()
    resumed = run_training(settings, TrainOptions(**{**options.__dict__, "max_steps": None, "until_idle": True,
                                                     "idle_timeout_s": 1.0}))
    assert resumed.steps == 0 and resumed.events == []
    assert _committed(settings, group, samples_topic, 3) == {0: 6, 1: 3, 2: 2}

    # A restart of the same run resumes from the published policy and step, drains what is left
    # (a partial batch) and stops when idle.
    more = [sample_record([random_sequence(rng, VOCAB, 5, 3, f"late{i}")], policy_version=START_VERSION + 2)
            for i in range(2)]
    _produce(settings, samples_topic, [(None, codec.encode("Sample", r)) for r in more])
    restart = TrainOptions(**{**options.__dict__, "max_steps": None, "until_idle": True})
    again = run_training(settings, restart)
    assert again.steps == 1 and again.stopped == "idle" and again.samples == 2
    assert again.events[0]["step"] == 3
    assert again.events[0]["policy_version_before"] == START_VERSION + 2
    assert sum(_committed(settings, group, samples_topic, 3).values()) == 13


def test_iterable_dataset_yields_batches_and_commits_only_when_told(
        kafka_bootstrap, tokentrail_settings, new_topic) -> None:
    from torch.utils.data import DataLoader

    from trainer_consumer.batching import BatchBuilder, FilterConfig
    from trainer_consumer.dataset import SampleBatchDataset, SampleStream

    settings = tokentrail_settings
    topic = new_topic(1)
    rng = np.random.default_rng(1)
    records = [sample_record([random_sequence(rng, VOCAB, 4, 2, f"d{i}")]) for i in range(5)]
    _produce(settings, topic, [(0, get_codec().encode("Sample", r)) for r in records])
    group = f"test-dataset-{uuid.uuid4().hex[:8]}"
    builder: BatchBuilder = BatchBuilder(batch_size=2, filters=FilterConfig().build())
    stream = SampleStream(kafka_config.consumer_config(settings.kafka, group), topic, builder,
                          current_version=lambda: 0)
    try:
        loader = DataLoader(SampleBatchDataset(stream, idle_timeout_s=1.5, until_idle=True), batch_size=None)
        batches = []
        for batch in loader:
            batches.append(batch)
            if len(batches) == 2:
                stream.commit(batch)  # only the second batch: it covers offsets 0..3
        assert [len(b.samples) for b in batches] == [2, 2, 1]
        assert [s.sample_id for b in batches for s in b.samples] == [r["event_id"] for r in records]
        assert stream.committed() == {0: 4}
        # Continuous mode keeps a partial batch pending when idle; flushing hands it out.
        extra = sample_record([random_sequence(rng, VOCAB, 4, 2, "d-extra")])
        _produce(settings, topic, [(0, get_codec().encode("Sample", extra))])
        assert stream.next_batch(1.5, flush_partial=False) is None
        tail = stream.next_batch(0.5, flush_partial=True)
        assert tail is not None and tail.sample_ids == [extra["event_id"]] and tail.positions[0][2] == 5
    finally:
        stream.close()


def test_idle_time_counts_only_once_the_group_has_assigned_the_partitions(
        kafka_bootstrap, tokentrail_settings, new_topic) -> None:
    """A restarted reader whose group still holds an old member (here one that does not answer the
    rebalance until it closes, as a killed one would not until its session expires) must not stop as
    idle before it holds its partitions: it waits for the assignment, then reads the records."""
    import threading

    from trainer_consumer.batching import BatchBuilder, FilterConfig
    from trainer_consumer.dataset import SampleStream

    settings = tokentrail_settings
    topic = new_topic(1)
    group = f"test-idle-{uuid.uuid4().hex[:8]}"

    def stream() -> SampleStream:
        builder: BatchBuilder = BatchBuilder(batch_size=8, filters=FilterConfig().build())
        return SampleStream(kafka_config.consumer_config(settings.kafka, group), topic, builder,
                            current_version=lambda: 0)

    old = stream()
    deadline = time.monotonic() + 60
    while not old.consumer.assignment():  # the old member holds the partition
        assert time.monotonic() < deadline, "the first member got no assignment"
        old.consumer.consume(timeout=0.5)
    rng = np.random.default_rng(2)
    records = [sample_record([random_sequence(rng, VOCAB, 4, 2, f"i{i}")]) for i in range(3)]
    _produce(settings, topic, [(0, get_codec().encode("Sample", r)) for r in records])
    new = stream()
    # The old member is not polled, so it does not rejoin: the rebalance waits for it until it leaves,
    # well after the new reader's idle time-out.
    leave = threading.Timer(3.0, old.close)
    leave.start()
    try:
        batch = new.next_batch(idle_timeout_s=1.0, flush_partial=True)
        assert batch is not None, "stopped as idle before the partitions were assigned"
        assert batch.sample_ids == [r["event_id"] for r in records]
    finally:
        leave.join()
        new.close()
