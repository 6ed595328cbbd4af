"""A private pipeline on the real broker: prefixed topics, worker subprocesses, output collection.

The workloads, the outputs the pure core derives for them (what the stream must produce) and the output
bookkeeping are shared with the reliability suite (reliability.pipeline)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from processors.grouper import GroupingConfig
from processors.pipeline import StageConfigs
from processors.stream.topics import OUTPUT_SPECS, StreamTopics, ensure_stream_topics
from processors.stream.worker import EXIT_STALLED
from processors.stream.worker_config import load_grouping
from reliability.pipeline import (  # noqa: F401 - re-exported for the tests
    OUTPUTS,
    Collected,
    Event,
    Record,
    comparable,
    derive_outputs,
    group_events,
    interleave,
    worker_log_tail,
)
from schemas.codec import DecodeError, get_codec
from schemas.kafka.config import consumer_config, producer_config
from tokentrail.runtime.process import start_worker_process, stop_worker_process
from tokentrail.settings import Settings

OUTPUT_NAMES = OUTPUTS


@dataclass
class StreamRig:
    settings: Settings
    topics: StreamTopics
    log_path: Path
    workers: list[subprocess.Popen] = field(default_factory=list)
    # Workers whose watchdog found them stuck (exit code 3) and that collect() restarted.
    watchdog_restarts: int = 0

    def __post_init__(self) -> None:
        self._launch: dict[int, tuple[tuple[str, ...], str | None]] = {}  # pid -> start_worker arguments
        self.codec = get_codec()
        self._producer = Producer(producer_config(self.settings.kafka))
        self._consumer: Consumer | None = None
        self.collected = Collected()

    # -- configuration the worker uses, for computing expectations

    @property
    def grouping(self) -> GroupingConfig:
        return load_grouping(self.settings.processors)

    @property
    def stages(self) -> StageConfigs:
        proc = self.settings.processors
        return StageConfigs.load(proc.reward_config, proc.credit_config, proc.sample_config)

    def expected(self, events: Iterable[Event], *, timers: bool = False) -> dict[str, dict[str, Record]]:
        """What the worker must emit; ``timers``: including expired attempts and PARTIAL groups."""
        timeout_us = round(self.settings.processors.attempt_timeout_s * 1e6) if timers else None
        return derive_outputs(events, self.grouping, self.stages, list(self.settings.processors.verifiers),
                              expire_after_us=timeout_us, close_groups=timers)

    # -- input

    def produce(self, events: Iterable[Event]) -> None:
        for name, rec in events:
            topic = self.topics.calls if name == "CallRecord" else self.topics.env
            self.produce_raw(topic, rec["rollout_id"].encode(), self.codec.encode(name, rec))
        assert self._producer.flush(30) == 0, "input not delivered to the broker within 30s"

    def produce_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        self._producer.produce(topic, key=key, value=value)
        self._producer.poll(0)

    def flush(self) -> None:
        assert self._producer.flush(30) == 0

    # -- workers

    def start_worker(self, *extra_args: str, app_id: str | None = None) -> subprocess.Popen:
        settings = self.settings
        if app_id:
            settings = settings.model_copy(update={"processors": settings.processors.model_copy(
                update={"app_id": app_id})})
        proc = start_worker_process(settings, topic_prefix=self.topics.prefix, log_path=self.log_path,
                                    extra_args=["--session-timeout", "6", "--tick", "0.5", "--stall-timeout", "30",
                                                *extra_args])
        self.workers.append(proc)
        self._launch[proc.pid] = (extra_args, app_id)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        proc.kill()  # SIGKILL: no commit, no flush, no goodbye to the group
        proc.wait(30)

    def stop_all(self) -> list[int]:
        return [stop_worker_process(p) for p in self.workers]

    # -- output

    def _consumer_for_outputs(self) -> Consumer:
        if self._consumer is None:
            consumer = Consumer(consumer_config(self.settings.kafka, f"rig-{uuid.uuid4().hex[:8]}"))
            names = {self.topics.output(n) for n in OUTPUT_SPECS}
            metadata = consumer.list_topics(timeout=30)
            consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in sorted(names)
                             for p in metadata.topics[t].partitions])
            self._consumer = consumer
        return self._consumer

    def collect(self, until: Callable[[Collected], bool], timeout_s: float = 60.0) -> Collected:
        """Poll output topics until ``until(collected)`` holds; fails with the worker log on time-out."""
        consumer = self._consumer_for_outputs()
        by_topic = {self.topics.output(n): n for n in OUTPUT_SPECS}
        deadline = time.monotonic() + timeout_s
        while not until(self.collected):
            for proc in list(self.workers):
                if proc.poll() == EXIT_STALLED:  # its watchdog stopped it: restart it, as a supervisor would
                    self.workers.remove(proc)
                    self.watchdog_restarts += 1
                    extra_args, app_id = self._launch[proc.pid]
                    self.start_worker(*extra_args, app_id=app_id)
                elif proc.poll() not in (None, 0, -9):
                    raise AssertionError(f"worker exited with {proc.returncode}\n{self.log_tail()}")
            if time.monotonic() > deadline:
                sizes = {n: len(v) for n, v in self.collected.records.items()}
                missing = getattr(until, "missing", None)
                what = f"; missing: {missing(self.collected)}" if missing else ""
                raise AssertionError(f"outputs incomplete after {timeout_s}s: {sizes}{what}\n{self.log_tail(120)}")
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error():
                    continue
                self._take(by_topic[msg.topic()], msg)
        return self.collected

    def settle(self, quiet_s: float = 3.0) -> Collected:
        """Keep collecting until nothing new arrives for ``quiet_s``."""
        consumer = self._consumer_for_outputs()
        by_topic = {self.topics.output(n): n for n in OUTPUT_SPECS}
        last = time.monotonic()
        while time.monotonic() - last < quiet_s:
            msgs = [m for m in consumer.consume(500, timeout=0.5) if not m.error()]
            for msg in msgs:
                self._take(by_topic[msg.topic()], msg)
            if msgs:
                last = time.monotonic()
        return self.collected

    def _take(self, name: str, msg: Any) -> None:
        try:
            record = self.codec.decode(msg.value(), expect=name)[1]
        except DecodeError:  # a test may put garbage on an output topic (the rollouts topic is an input too)
            self.collected.undecodable.append(msg.value())
            return
        self.collected.add(name, msg.key(), record)

    def log_tail(self, lines: int = 60) -> str:
        return worker_log_tail(self.log_path, lines)

    def close(self) -> None:
        self.stop_all()
        if self._consumer is not None:
            self._consumer.close()


def make_rig(base: Settings, tmp_path: Path, kafka_overrides: dict[str, Any] | None = None,
             **processor_overrides: Any) -> StreamRig:
    tag = uuid.uuid4().hex[:8]
    processors = base.processors.model_copy(update={
        "app_id": f"test-processors-{tag}", "state_dir": tmp_path / "state", **processor_overrides})
    settings = base.model_copy(update={
        "kafka": base.kafka.model_copy(update={"partitions": 2, **(kafka_overrides or {})}),
        "processors": processors})
    topics = StreamTopics(f"test-{tag}.")
    report = ensure_stream_topics(settings.kafka, topics)
    assert report.ok, report.differences
    return StreamRig(settings, topics, tmp_path / "worker.log")
