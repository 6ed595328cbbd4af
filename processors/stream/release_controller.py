"""The release's Kafka adapter: read the decisions topic to its end, write a decision, and run the controller.

The controller (``run_controller``, ``tokentrail release control``) is a thin loop around the pure
``processors.release.feed.ReleaseFeed``: it folds the decisions topic, then reads calls and rewards (from
the current release's start when one is in progress, else from their ends) together with new decisions,
and writes the decisions the feed returns. It commits no offsets: on every start it rebuilds its state
from the topics (docs/release.md), so a crash loses nothing and counts nothing twice. Run one instance.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from processors.release.events import RELEASE_DECISION, Record
from processors.release.feed import ReleaseFeed
from schemas.codec import Codec, DecodeError
from schemas.kafka.config import KafkaSettings, consumer_config, producer_config
from schemas.kafka.registry_framing import kafka_codec

Log = Callable[[str], None]


class ReleaseTopicError(Exception):
    """A release topic that cannot be used: missing, not read to its end in time, or a write not acknowledged
    (the ``tokentrail release`` commands print it for a person to act on)."""


@dataclass
class DecisionsRead:
    records: list[Record]  # in topic order
    unreadable: list[str]  # why each record that is not a readable ReleaseDecision was skipped
    ends: dict[int, int] = field(default_factory=dict)  # partition -> the offset read up to


def _partitions(consumer: Consumer, topic: str, kafka: KafkaSettings, timeout_s: float) -> list[int]:
    """The topic's partitions. A topic created a moment ago may not be in the broker's metadata yet, so a
    missing topic is looked up again until ``timeout_s`` (at most 10 s) before it is an error."""
    deadline = time.monotonic() + min(timeout_s, 10.0)
    while True:
        info = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if info is not None and info.error is None and info.partitions:
            return sorted(info.partitions)
        if time.monotonic() >= deadline:
            raise ReleaseTopicError(f"topic {topic} does not exist on {kafka.bootstrap_servers}: "
                           "run `tokentrail topics ensure`")
        time.sleep(0.2)


def read_decisions(kafka: KafkaSettings, topic: str, timeout_s: float) -> DecisionsRead:
    """Every ReleaseDecision on ``topic`` up to its current end, in partition-then-offset order (the topic
    has one partition, so that is the order they were written). Commits nothing."""
    consumer = Consumer(consumer_config(kafka, f"tokentrail-release-read-{uuid.uuid4().hex[:12]}"))
    codec = kafka_codec(kafka.schema_registry_url)
    try:
        parts = _partitions(consumer, topic, kafka, timeout_s)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1] for p in parts}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        found: dict[int, list[Record]] = {p: [] for p in parts}
        unreadable: list[str] = []
        waiting = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout_s
        while waiting:
            if time.monotonic() > deadline:
                raise ReleaseTopicError(f"could not read {topic} to its end within {timeout_s:g} s")
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(msg.error())
                p = msg.partition()
                if msg.offset() < ends[p]:
                    try:
                        found[p].append(codec.decode(msg.value(), expect=RELEASE_DECISION, topic=topic,
                                                     partition=p, offset=msg.offset())[1])
                    except DecodeError as exc:
                        unreadable.append(str(exc))
                if msg.offset() + 1 >= ends[p]:
                    waiting.discard(p)
        return DecisionsRead([r for p in parts for r in found[p]], unreadable, ends)
    finally:
        consumer.close()


class DecisionWriter:
    """Writes decisions (key: the model) and waits until the broker has each (acks=all)."""

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        self.kafka, self.topic = kafka, topic
        self.codec = kafka_codec(kafka.schema_registry_url)
        self.producer = Producer(producer_config(kafka))

    def write(self, record: Record) -> None:
        failures: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                failures.append(err)

        self.producer.produce(self.topic, key=record["model"].encode(),
                              value=self.codec.encode(RELEASE_DECISION, record), on_delivery=delivered)
        if self.producer.flush(30) > 0:
            raise ReleaseTopicError(f"a decision was not acknowledged by {self.kafka.bootstrap_servers} within 30 s")
        if failures:
            raise KafkaException(failures[0])


def publish_decision(kafka: KafkaSettings, topic: str, record: Record) -> None:
    DecisionWriter(kafka, topic).write(record)


# ---- the controller --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ControllerTopics:
    calls: str
    rewards: str
    decisions: str


def run_controller(
    kafka: KafkaSettings, topics: ControllerTopics, *, idle_s: float | None = None, progress_every_s: float = 10.0,
    timeout_s: float = 30.0, log: Log = print, should_stop: Callable[[], bool] = lambda: False,
    reward_source: str = "verifier",
) -> ReleaseFeed:
    """Run until ``should_stop()``, or (with ``idle_s``) until it has read what the topics held when it started
    and then ``idle_s`` passed without a record; returns the feed (its counts and states)."""
    feed = ReleaseFeed(source=reward_source)
    read = read_decisions(kafka, topics.decisions, timeout_s)
    for reason in read.unreadable:
        log(f"controller: skipped a record on {topics.decisions}: {reason}")
    for record in read.records:
        feed.on_decision(record)
    starts = feed.release_starts_us()
    log(f"controller: {len(read.records)} decisions read; releases in progress: "
        + (", ".join(f"{m} (candidate {feed.states[m].candidate_version})" for m in sorted(starts)) or "none"))
    consumer = Consumer(consumer_config(kafka, f"tokentrail-release-controller-{uuid.uuid4().hex[:12]}"))
    writer = DecisionWriter(kafka, topics.decisions)
    codec = kafka_codec(kafka.schema_registry_url)
    try:
        since_ms = min(starts.values()) // 1000 if starts else None
        assignment = [TopicPartition(topics.decisions, p, read.ends.get(p, OFFSET_BEGINNING))
                      for p in _partitions(consumer, topics.decisions, kafka, timeout_s)]
        for topic in (topics.calls, topics.rewards):
            partitions = _partitions(consumer, topic, kafka, timeout_s)
            # Each partition's end before the time lookup. "None at or after the start" (and no release) must start
            # there, not at the logical end: that is resolved only once fetching begins, past whatever arrived in
            # between (a release's first calls, missed: the release guard's test, 2026-12-05).
            ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
                    for p in partitions}
            parts = [TopicPartition(topic, p, since_ms if since_ms is not None else OFFSET_END) for p in partitions]
            # Re-read from the release's start: the first offset at or after that time (none: the end, as it was).
            found = consumer.offsets_for_times(parts, timeout=timeout_s) if since_ms is not None else parts
            assignment += [tp if tp.offset >= 0 else TopicPartition(topic, tp.partition, ends[tp.partition])
                           for tp in found]
        # What the topics hold now: the idle countdown starts only once all of it is read.
        behind = {(tp.topic, tp.partition): end for tp in assignment if tp.offset >= 0
                  and (end := consumer.get_watermark_offsets(tp, timeout=timeout_s)[1]) > tp.offset}
        consumer.assign(assignment)
        expect = {topics.calls: "CallRecord", topics.rewards: "Reward", topics.decisions: RELEASE_DECISION}
        last_record = last_progress = time.monotonic()
        while not should_stop():
            messages = consumer.consume(500, timeout=0.5)
            now = time.monotonic()
            if messages:
                last_record = now
            elif idle_s is not None and not behind and now - last_record >= idle_s:
                break
            for msg in messages:
                key = (msg.topic(), msg.partition())
                if key in behind and msg.offset() + 1 >= behind[key]:
                    del behind[key]
                for record in _handle(feed, codec, msg, expect, log):
                    writer.write(record)
                    log(f"controller: decision {record['sequence']} on {record['model']!r}: {record['action']} "
                        f"({record['rule']}): {record['reason']}")
            if now - last_progress >= progress_every_s:
                log(_progress(feed))
                last_progress = now
        log(_progress(feed))
    finally:
        consumer.close()
    return feed


def _handle(feed: ReleaseFeed, codec: Codec, msg: Message, expect: dict[str, str], log: Log) -> list[Record]:
    if msg.error():
        if msg.error().code() == KafkaError._PARTITION_EOF:
            return []
        raise KafkaException(msg.error())
    topic = msg.topic()
    try:
        _, record = codec.decode(msg.value(), expect=expect[topic], topic=topic, partition=msg.partition(),
                                 offset=msg.offset())
    except DecodeError as exc:
        feed.skipped[f"unreadable record ({type(exc).__name__})"] += 1
        log(f"controller: skipped {exc}")
        return []
    if expect[topic] == RELEASE_DECISION:
        feed.on_decision(record)
        return []
    return feed.on_call(record) if expect[topic] == "CallRecord" else feed.on_reward(record)


def _progress(feed: ReleaseFeed) -> str:
    tracks = []
    for model, state in sorted(feed.states.items()):
        if state.candidate_version is None:
            tracks.append(f"{model}: serving {state.serving_version}")
        else:
            tracks.append(f"{model}: serving {state.serving_version} ({state.serving.rewards} rewards), candidate "
                          f"{state.candidate_version} at {state.candidate_fraction:.0%} ({state.candidate.rewards})")
    skipped = sum(feed.skipped.values())
    pinned = sum(n for (_model, _label, kind), n in feed.pinned.items() if kind == "calls")
    checks = f", {pinned} pinned calls left out" if pinned else ""
    if feed.client_aborts:
        checks += f", {sum(feed.client_aborts.values())} calls the client aborted left out (not errors)"
    if feed.arm_disagreements:
        checks += (f", {sum(feed.arm_disagreements.values())} calls whose release arm disagrees with the decision "
                   "log (counted by the version that produced them)")
    return (f"controller: {feed.counts['calls']} calls, {feed.counts['rewards']} rewards, "
            f"{feed.counts['decisions']} decisions folded, {skipped} inputs skipped{checks}; "
            + ("; ".join(tracks) or "no track"))
