"""What the freshness benchmark reads back: the trainer's consumer, timed, and every stage's record times.

``TrainerProbe`` is the trainer's own consumer (``SampleStream`` + ``BatchBuilder``, the trainer's batch
size and idle flush) on a thread, noting when each record reached it and when its batch was cut.
``read_stage_times`` reads the stages' topics afterwards: every record's Kafka timestamp is the
broker's append time (the benchmark's topics are LogAppendTime), so each stage is timed by the record
it wrote, not by a clock in the benchmark.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaError, TopicPartition

from bench.freshness_workload import event_time_us
from schemas.codec import get_codec
from trainer_consumer.batching import BatchBuilder
from trainer_consumer.dataset import Position, SampleStream


class _TimedStream(SampleStream):
    """The trainer's sample stream, noting the wall time each record was taken from the consumer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.consumed_at: dict[Position, float] = {}

    def _take_message(self, msg: Any) -> None:
        self.consumed_at[(msg.topic(), msg.partition(), msg.offset())] = time.time()
        super()._take_message(msg)


class TrainerProbe:
    """Runs the trainer's consumer loop (no learner) until stopped: batches cut, committed."""

    def __init__(self, consumer_conf: dict[str, Any], topic: str, batch_size: int, idle_timeout_s: float) -> None:
        self.stream = _TimedStream(consumer_conf, topic, BatchBuilder(batch_size), current_version=lambda: 0)
        self.idle_timeout_s = idle_timeout_s
        self.batched_at: dict[Position, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainer-probe", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> TrainerProbe:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # flush_partial: a partial batch goes after idle_timeout_s without records, as the
                # trainer's --flush-partial does; otherwise a batch is cut when it is full.
                batch = self.stream.next_batch(self.idle_timeout_s, flush_partial=True)
                if batch is None:
                    continue
                now = time.time()
                for position in batch.positions:
                    self.batched_at[position] = now
                self.stream.commit(batch)
        except BaseException as exc:  # reported by the benchmark
            self.error = exc

    def consumed(self) -> int:
        return len(self.stream.consumed_at)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.stream.close()


@dataclass
class StageTimes:
    """Per rollout id: when it finished and when each stage's record holding it was on Kafka (ms)."""

    finish_ms: dict[str, float] = field(default_factory=dict)  # CompletedRollout.created_at_us
    rollout_ms: dict[str, float] = field(default_factory=dict)
    group_ms: dict[str, float] = field(default_factory=dict)
    group_of: dict[str, str] = field(default_factory=dict)  # rollout id -> group event id
    sample_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    sample_pos: dict[str, list[Position]] = field(default_factory=lambda: defaultdict(list))
    calls_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # call end -> on Kafka
    group_status: dict[str, str] = field(default_factory=dict)
    # Records whose timestamp is not the broker's append time, by topic (must stay empty).
    not_log_append: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def _read_all(conf: dict[str, Any], topic: str, timeout_s: float = 60.0) -> list[Any]:
    consumer = Consumer({**conf, "enable.partition.eof": True})
    try:
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        pending, out = set(parts), []
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                err = msg.error()
                if err is None:
                    out.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                else:
                    raise RuntimeError(f"reading {topic}: {err}")
        if pending:
            raise RuntimeError(f"reading {topic}: partitions {sorted(pending)} did not reach their end")
        return out
    finally:
        consumer.close()


def read_stage_times(conf: dict[str, Any], calls: str, rollouts: str, groups: str, samples: str) -> StageTimes:
    codec, times = get_codec(), StageTimes()

    def appended_ms(msg: Any) -> float:
        kind, ms = msg.timestamp()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            times.not_log_append[msg.topic()] += 1
        return float(ms)

    for msg in _read_all(conf, calls):
        _, rec = codec.decode(msg.value(), expect="CallRecord")
        times.calls_ms[rec["rollout_id"]].append(appended_ms(msg) - event_time_us("CallRecord", rec) / 1000)
    for msg in _read_all(conf, rollouts):
        _, rec = codec.decode(msg.value(), expect="CompletedRollout")
        if rec["status"] == "COMPLETE":
            times.finish_ms[rec["rollout_id"]] = int(rec["created_at_us"]) / 1000
            times.rollout_ms[rec["rollout_id"]] = appended_ms(msg)
    for msg in _read_all(conf, groups):
        _, rec = codec.decode(msg.value(), expect="RolloutGroup")
        for rid in rec["rollout_ids"]:
            times.group_ms[rid] = appended_ms(msg)
            times.group_of[rid] = rec["event_id"]
            times.group_status[rid] = rec["status"]
    for msg in _read_all(conf, samples):
        _, rec = codec.decode(msg.value(), expect="Sample")
        for rid in set(rec["rollout_ids"]):
            times.sample_ms[rid].append(appended_ms(msg))
            times.sample_pos[rid].append((msg.topic(), msg.partition(), msg.offset()))
    return times
