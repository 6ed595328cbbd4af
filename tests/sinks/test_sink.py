"""The sink on a real Kafka broker: every topic into chDB, dead letters, commits, re-delivery."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable

from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, Producer

from processors.pipeline import StageConfigs
from schemas import topics
from schemas.codec import get_codec
from schemas.kafka import config as kafka_config
from sinks.audit import run_audit
from sinks.replay import publish, replay
from sinks.rows import TABLE_OF
from sinks.sink import SinkOptions, run_sink
from sinks.store import load_records, table_counts, write_records
from testkit.storage_records import GroupSpec, synthetic_group
from tokentrail.settings import Settings

from .pipeline_data import CONFIGS, pipeline_events, sample_config

KEY_FIELD = {"RolloutGroup": "group_id", "TrainerStep": "run_id"}


def key_of(name: str, rec: dict) -> bytes:
    return (rec["rollout_ids"][0] if name == "Sample" else rec[KEY_FIELD.get(name, "rollout_id")]).encode()


def make_topics(new_topic: Callable[..., str]) -> tuple[dict[str, tuple[str, ...]], dict[str, str], str]:
    """A throwaway topic for each tokentrail topic: (topic map, record name -> topic, dead-letter topic)."""
    topic_map, topic_of = {}, {}
    dead = ""
    for spec in topics.ALL_TOPICS:
        name = new_topic(partitions=2)
        topic_map[name] = spec.value_schemas
        for record_name in spec.value_schemas:
            topic_of[record_name] = name
        if spec is topics.DEAD_LETTER:
            dead = name
    return topic_map, topic_of, dead


def produce(settings: Settings, messages: list[tuple[str, bytes | None, bytes]]) -> None:
    producer = Producer(kafka_config.producer_config(settings.kafka))
    for topic, key, value in messages:
        producer.produce(topic, value=value, key=key)
    assert producer.flush(30) == 0


def test_sink_stores_every_topic_dead_letters_and_deduplicates(
    kafka_bootstrap: str, tokentrail_settings: Settings, new_topic: Callable[..., str], ch: Client
) -> None:
    settings = tokentrail_settings
    topic_map, topic_of, dead_topic = make_topics(new_topic)
    codec = get_codec()
    # Task prompts of 300 tokens: long enough to be stored once per group (sinks/shared_prompts.py).
    groups = [
        synthetic_group(GroupSpec(group_index=i, pack=True, bodies="chat", tools=2, prompt_tokens=300))
        for i in range(2)
    ]
    events = [e for g in groups for e in g.events]
    messages = [(topic_of[name], key_of(name, rec), codec.encode(name, rec)) for name, rec in events]
    score = next(rec for name, rec in events if name == "Score")
    bad = [
        (topic_of["CallRecord"], b"k1", b"not avro at all"),
        (topic_of["CallRecord"], b"k2", codec.encode("CallRecord", groups[0].of("CallRecord")[0])[:40]),
        (topic_of["CallRecord"], b"k3", codec.encode("Score", score)),  # wrong type for the topic
    ]
    produce(settings, messages + bad)

    group_id = f"test-sink-{uuid.uuid4().hex[:8]}"
    options = SinkOptions(group_id=group_id, idle_s=3.0, batch_rows=50, progress_every_s=0)
    lines: list[str] = []
    stats = run_sink(ch, settings.kafka, options, topic_map=topic_map, dead_letter_topic=dead_topic, log=lines.append)

    expected = Counter(TABLE_OF[name] for name, _ in events)
    counts = table_counts(ch)
    assert {t: counts[t] for t in expected} == dict(expected)
    assert counts["dead_letters"] == 3 and stats.dead_letters == 3
    assert stats.batches > 1  # small batches: several insert+commit rounds
    reasons = dict(ch.query("SELECT key, concat(error_type, ': ', reason) FROM dead_letters FINAL").result_rows)
    assert reasons["k1"].startswith("CorruptRecord")
    assert reasons["k2"].startswith("TruncatedPayload")
    assert reasons["k3"].startswith("SchemaMismatch") and "expected CallRecord, got Score" in reasons["k3"]
    assert any("dead letter" in line for line in lines) and lines[-1].startswith("sink: ")
    assert all(r.passed for r in run_audit(ch))
    # Later calls' request bodies were stored as deltas on their bases, and come back whole.
    calls = sorted((rec for name, rec in events if name == "CallRecord"), key=lambda c: c["event_id"])
    assert load_records(ch, "calls", order_by="event_id") == calls
    deltas, copied = ch.query(
        "SELECT countIf(request_base_call_id IS NOT NULL), countIf(notEmpty(request_copies)) FROM calls FINAL "
        "WHERE call_index > 0").result_rows[0]
    assert deltas == copied == sum(1 for c in calls if c["call_index"] > 0)  # each repeats its base's answer
    # A group's rollouts share their task prompt: the ones stored after the first name it instead (some
    # may stay whole: a batch only names a smaller call id), their identical first request bodies too,
    # and every prompt and body came back whole above.
    shared, shared_bodies = ch.query(
        "SELECT countIf(prompt_shared_call_id IS NOT NULL), "
        "countIf(request_base_call_id = prompt_shared_call_id) FROM calls FINAL WHERE call_index = 0"
    ).result_rows[0]
    assert 0 < shared <= sum(1 for c in calls if c["call_index"] == 0) - len(groups)
    assert shared_bodies == shared

    # The dead letters went to the dead-letter topic too, decodable, with the reason.
    consumer = Consumer(kafka_config.consumer_config(settings.kafka, f"{group_id}-dlq"))
    consumer.subscribe([dead_topic])
    letters = []
    for _ in range(100):
        msg = consumer.poll(1.0)
        if msg is not None and not msg.error():
            letters.append(codec.decode(msg.value(), expect="DeadLetter")[1])
        if len(letters) == 3:
            break
    consumer.close()
    assert sorted(letter["error_type"] for letter in letters) == [
        "CorruptRecord",
        "SchemaMismatch",
        "TruncatedPayload",
    ]
    assert {letter["source_topic"] for letter in letters} == {topic_of["CallRecord"]}

    # Offsets were committed: the same group finds nothing new.
    again = run_sink(
        ch,
        settings.kafka,
        SinkOptions(group_id=group_id, once=True, progress_every_s=0),
        topic_map=topic_map,
        dead_letter_topic=dead_topic,
        log=lines.append,
    )
    assert again.messages == 0

    # Re-delivery: the producer sends everything again, and a new group re-reads every topic.
    produce(settings, messages)
    rerun = run_sink(
        ch,
        settings.kafka,
        SinkOptions(group_id=f"{group_id}-replay", idle_s=3.0, progress_every_s=0),
        topic_map=topic_map,
        dead_letter_topic=dead_topic,
        log=lines.append,
    )
    # Everything twice, the bad ones again, and the dead-letter topic (which this run adds to again).
    assert rerun.messages >= 2 * len(messages) + len(bad) + 3
    assert ch.query("SELECT count() FROM calls").result_rows[0][0] > expected["calls"]  # stored twice...
    assert table_counts(ch) == counts  # ...but one row per event after FINAL
    assert all(r.passed for r in run_audit(ch))
    assert load_records(ch, "calls", order_by="event_id") == calls


def test_replay_publishes_to_kafka_and_the_sink_stores_it(
    kafka_bootstrap: str,
    tokentrail_settings: Settings,
    new_topic: Callable[..., str],
    ch: Client,
    chdb_dsn: str,
) -> None:
    """Stored rollouts and scores -> replay under a packing config -> Kafka -> sink -> new samples."""
    settings = tokentrail_settings
    events, _group, _members = pipeline_events(7, CONFIGS.sample)
    write_records(ch, events)
    packing = sample_config(merge=True, pack=True)
    result = replay(ch, StageConfigs(CONFIGS.reward, CONFIGS.credit, packing))
    topic_map, topic_of, dead_topic = make_topics(new_topic)
    assert publish(result.events, settings.kafka, topic_of) == len(result.events)
    before = table_counts(ch)
    run_sink(
        ch,
        settings.kafka,
        SinkOptions(group_id=f"test-replay-{uuid.uuid4().hex[:8]}", once=True, progress_every_s=0),
        topic_map=topic_map,
        dead_letter_topic=dead_topic,
        log=lambda _line: None,
    )
    after = table_counts(ch)
    new_samples = [r for n, r in result.events if n == "Sample"]
    assert new_samples and {s["sample_config_id"] for s in new_samples} == {packing.id}
    assert after["samples"] == before["samples"] + len(new_samples)
    assert after["rewards"] == before["rewards"] and after["credits"] == before["credits"]  # same configs: same ids
    assert all(r.passed for r in run_audit(ch))
