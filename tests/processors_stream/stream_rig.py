"""A private pipeline on the real broker: prefixed topics, a worker subprocess, output collection,
and the outputs the pure core computes for the same input (what the stream must produce)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from processors.assembler import RolloutAssembly
from processors.grouper import GrouperState, GroupingConfig
from processors.pipeline import StageConfigs, process_group
from processors.stream.config import load_grouping
from processors.stream.topics import OUTPUT_SPECS, StreamTopics, ensure_stream_topics
from processors.testing import AttemptSpec, attempt_events, growing_turns
from processors.verifiers import VerifierRunner, load_verifiers
from processors.worker import EXIT_STALLED, start_worker_process, stop_worker_process
from schemas.codec import DecodeError, get_codec
from schemas.topics import admin_config, consumer_config, producer_config
from tokentrail.settings import Settings

Record = dict[str, Any]
Event = tuple[str, Record]
OUTPUT_NAMES = ("CompletedRollout", "RolloutGroup", "Score", "Reward", "Credit", "Sample", "DeadLetter")
# Fields measured at run time rather than derived from the input.
VOLATILE = {"Score": ("duration_ms",)}


# ------------------------------------------------------------------------------------ workloads


def group_events(group: str, answers: list[str], *, calls: int = 3, env: int = 2, seed: int = 0,
                 expected: int | None = None, t0_us: int = 1_700_000_000_000_000) -> list[Event]:
    """Events of one group of rollouts answering "2 + 2" (answer 4), one rollout per answer."""
    rng = np.random.default_rng(seed)
    events: list[Event] = []
    for k, answer in enumerate(answers):
        texts = [f"step {i}" for i in range(calls - 1)] + [answer]
        turns = growing_turns(rng, calls, 24, 6, 8, vocab=900, texts=texts)
        events += attempt_events(AttemptSpec(
            f"{group}-r{k}", "a1", turns, env_events=env, task_input={"answer": "4"}, group_id=group,
            expected_group_size=expected or len(answers), t0_us=t0_us + 1000 * k))
    return events


def interleave(events: list[Event], seed: int = 0) -> list[Event]:
    """A shuffled order that keeps each attempt's own events in order (as one producer would)."""
    rng = np.random.default_rng(seed)
    queues: dict[str, list[Event]] = defaultdict(list)
    for ev in events:
        queues[ev[1]["rollout_id"]].append(ev)
    out = []
    while queues:
        rid = sorted(queues)[int(rng.integers(len(queues)))]
        out.append(queues[rid].pop(0))
        if not queues[rid]:
            del queues[rid]
    return out


# ------------------------------------------------------------------------------------ the core's answer


def core_outputs(events: Iterable[Event], grouping: GroupingConfig, stages: StageConfigs,
                 verifier_specs: list[str], *, expire_after_us: int | None = None,
                 close_groups: bool = False) -> dict[str, dict[str, Record]]:
    """Rollouts, groups and derived events the pure core emits for these events, in this order.

    ``expire_after_us``: then expire every open attempt with that time-out (INCOMPLETE rollouts);
    ``close_groups``: then close every open group (PARTIAL), as the timers eventually do."""
    verifiers = load_verifiers(verifier_specs)
    states: dict[str, RolloutAssembly] = {}
    grouper = GrouperState()
    out: dict[str, dict[str, Record]] = {name: {} for name in OUTPUT_NAMES}
    rollouts: dict[str, Record] = {}

    def close(group: Record) -> None:
        out["RolloutGroup"][group["event_id"]] = group
        members = [rollouts[e] for e in group["rollout_event_ids"]]
        derived = process_group(group, members, verifiers, stages.reward, stages.credit, stages.sample,
                                runner=VerifierRunner())
        for kind, record in derived.events():
            out[kind][record["event_id"]] = record

    def emit(rollout: Record) -> None:
        out["CompletedRollout"][rollout["event_id"]] = rollout
        rollouts[rollout["event_id"]] = rollout
        for emitted in grouper.add(rollout, grouping).emitted:
            close(emitted.group)

    for name, rec in events:
        state = states.setdefault(rec["rollout_id"], RolloutAssembly(rec["rollout_id"]))
        for rollout in state.accept(name, rec).rollouts:
            emit(rollout)
    far_future = 2**62
    if expire_after_us is not None:
        for state in states.values():
            for rollout in state.expire_due(far_future, expire_after_us):
                emit(rollout)
    if close_groups:
        for emitted in grouper.close_due(far_future, grouping):
            close(emitted.group)
    return out


def comparable(name: str, record: Record) -> Record:
    return {k: v for k, v in record.items() if k not in VOLATILE.get(name, ())}


# ------------------------------------------------------------------------------------ the rig


@dataclass
class Collected:
    """Every output message seen, in arrival order, decoded."""

    records: dict[str, list[Record]] = field(default_factory=lambda: {n: [] for n in OUTPUT_NAMES})
    keys: dict[str, list[bytes | None]] = field(default_factory=lambda: {n: [] for n in OUTPUT_NAMES})
    undecodable: list[bytes] = field(default_factory=list)

    def add(self, name: str, key: bytes | None, record: Record) -> None:
        self.records[name].append(record)
        self.keys[name].append(key)

    def ids(self, name: str) -> set[str]:
        return {r["event_id"] for r in self.records[name]}

    def unique(self, name: str) -> dict[str, Record]:
        return {r["event_id"]: r for r in self.records[name]}

    def counts(self, name: str) -> Counter[str]:
        return Counter(r["event_id"] for r in self.records[name])


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
        self._producer = Producer(producer_config(self.settings))
        self._consumer: Consumer | None = None
        self.collected = Collected()

    # -- configuration the worker uses, for computing expectations

    @property
    def grouping(self) -> GroupingConfig:
        return load_grouping(self.settings)

    @property
    def stages(self) -> StageConfigs:
        proc = self.settings.processors
        return StageConfigs.load(proc.reward_config, proc.credit_config, proc.sample_config)

    def expected(self, events: Iterable[Event], *, timers: bool = False) -> dict[str, dict[str, Record]]:
        """What the worker must emit; ``timers``: including expired attempts and PARTIAL groups."""
        timeout_us = round(self.settings.processors.attempt_timeout_s * 1e6) if timers else None
        return core_outputs(events, self.grouping, self.stages, list(self.settings.processors.verifiers),
                            expire_after_us=timeout_us, close_groups=timers)

    # -- input

    def produce(self, events: Iterable[Event]) -> None:
        for name, rec in events:
            topic = self.topics.calls if name == "CallRecord" else self.topics.env
            self.produce_raw(topic, rec["rollout_id"].encode(), self.codec.encode(name, rec))
        self._producer.flush(30)

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
            consumer = Consumer(consumer_config(self.settings, f"rig-{uuid.uuid4().hex[:8]}"))
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
                raise AssertionError(f"outputs incomplete after {timeout_s}s: {sizes}\n{self.log_tail()}")
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
        if not self.log_path.exists():
            return "(no worker log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        self.stop_all()
        if self._consumer is not None:
            self._consumer.close()


def delete_topics(settings: Settings, prefixes: Iterable[str]) -> None:
    """Remove every topic whose name starts with one of ``prefixes`` (test clean-up)."""
    admin = AdminClient(admin_config(settings))
    names = [t for t in admin.list_topics(timeout=30).topics if t.startswith(tuple(prefixes))]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            try:
                future.result(timeout=60)
            except Exception:  # already gone
                pass


def make_rig(base: Settings, tmp_path: Path, **processor_overrides: Any) -> StreamRig:
    tag = uuid.uuid4().hex[:8]
    processors = base.processors.model_copy(update={
        "app_id": f"test-processors-{tag}", "state_dir": tmp_path / "state", **processor_overrides})
    settings = base.model_copy(update={
        "kafka": base.kafka.model_copy(update={"partitions": 2}), "processors": processors})
    topics = StreamTopics(f"test-{tag}.")
    report = ensure_stream_topics(settings, topics)
    assert report.ok, report.differences
    return StreamRig(settings, topics, tmp_path / "worker.log")
