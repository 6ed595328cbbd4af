"""A private stream pipeline on a broker: prefixed topics, worker subprocesses, output collection, and
what the pure core derives from the same input (what a clean run must produce).

Used by the bad-input corpus (topic cases) and the worker / redelivery fault scenarios.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from processors.stream.topics import OUTPUT_SPECS, StreamTopics, ensure_stream_topics
from processors.stream.worker import EXIT_STALLED
from schemas.codec import DecodeError, get_codec
from schemas.kafka.config import admin_config, consumer_config, producer_config
from testkit.kafka_read import delete_topics_by_prefix
from tokentrail.runtime.process import start_worker_process, stop_worker_process
from tokentrail.settings import Settings

if TYPE_CHECKING:
    from processors.grouper import GroupingConfig
    from processors.pipeline import StageConfigs

Record = dict[str, Any]
Event = tuple[str, Record]
OUTPUTS = ("CompletedRollout", "RolloutGroup", "Score", "Reward", "Credit", "Sample", "DeadLetter")
VOLATILE = {"Score": ("duration_ms",)}  # measured at run time, not derived from the input
ANSWERS = ("The answer is 4", "The answer is 5", "4", "no idea")


# ------------------------------------------------------------------------------------------ workload


def group_events(group: str, answers: Iterable[str] = ANSWERS, *, calls: int = 3, env: int = 2, seed: int = 0,
                 expected: int | None = None, t0_us: int = 1_700_000_000_000_000) -> list[Event]:
    """One group of rollouts answering "2 + 2" (answer 4), one rollout per answer, prompts delta-encoded;
    ``expected``: the group size the attempts announce (default: one per answer)."""
    from testkit.stages import AttemptSpec, attempt_events, growing_turns

    answers = list(answers)
    rng = np.random.default_rng(seed)
    events: list[Event] = []
    for k, answer in enumerate(answers):
        texts = [f"step {i}" for i in range(calls - 1)] + [answer]
        turns = growing_turns(rng, calls, 24, 6, 8, vocab=900, texts=texts)
        events += attempt_events(AttemptSpec(f"{group}-r{k}", "a1", turns, env_events=env,
                                             task_input={"answer": "4"}, group_id=group,
                                             expected_group_size=expected or len(answers),
                                             t0_us=t0_us + 1000 * k))
    return events


def interleave(events: list[Event], seed: int = 0) -> list[Event]:
    """Shuffle across rollouts, keeping each rollout's own events in order (one producer per rollout)."""
    rng = np.random.default_rng(seed)
    queues: dict[str, list[Event]] = {}
    for ev in events:
        queues.setdefault(ev[1]["rollout_id"], []).append(ev)
    out = []
    while queues:
        rid = sorted(queues)[int(rng.integers(len(queues)))]
        out.append(queues[rid].pop(0))
        if not queues[rid]:
            del queues[rid]
    return out


def workload(tag: str, groups: int, seed: int) -> list[Event]:
    events: list[Event] = []
    for g in range(groups):
        events += group_events(f"{tag}-g{g}", calls=4, env=3, seed=seed * 100 + g)
    return interleave(events, seed=seed)


def core_outputs(events: Iterable[Event], settings: Settings) -> dict[str, dict[str, Record]]:
    """Event id -> record of everything the pure core emits for ``events`` with these settings' configs."""
    from processors.pipeline import StageConfigs
    from processors.stream.worker_config import load_grouping

    proc = settings.processors
    stages = StageConfigs.load(proc.reward_config, proc.credit_config, proc.sample_config)
    return derive_outputs(events, load_grouping(proc), stages, list(proc.verifiers))


def derive_outputs(events: Iterable[Event], grouping: GroupingConfig, stages: StageConfigs, verifier_specs: list[str],
                   *, expire_after_us: int | None = None, close_groups: bool = False) -> dict[str, dict[str, Record]]:
    """Rollouts, groups and derived events the pure core emits for these events, in this order.

    ``expire_after_us``: then expire every open attempt with that time-out (INCOMPLETE rollouts);
    ``close_groups``: then close every open group (PARTIAL), as the timers eventually do."""
    from processors.assembler import RolloutAssembly
    from processors.grouper import GrouperState
    from processors.isolation.calls import verifier_runner
    from processors.pipeline import process_group
    from processors.verifiers import load_verifiers

    verifiers = load_verifiers(verifier_specs)
    states: dict[str, RolloutAssembly] = {}
    grouper = GrouperState()
    out: dict[str, dict[str, Record]] = {name: {} for name in OUTPUTS}

    def close(group: Record) -> None:
        out["RolloutGroup"][group["event_id"]] = group
        members = [out["CompletedRollout"][e] for e in group["rollout_event_ids"]]
        derived = process_group(group, members, verifiers, stages.reward, stages.credit, stages.sample,
                                runner=verifier_runner())
        for kind, record in derived.events():
            out[kind][record["event_id"]] = record

    def emit(rollout: Record) -> None:
        out["CompletedRollout"][rollout["event_id"]] = rollout
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


# ------------------------------------------------------------------------------------------ outputs


@dataclass
class Collected:
    """Every output message seen, decoded, in arrival order (redeliveries included)."""

    records: dict[str, list[Record]] = field(default_factory=lambda: {n: [] for n in OUTPUTS})
    keys: dict[str, list[bytes | None]] = field(default_factory=lambda: {n: [] for n in OUTPUTS})
    undecodable: list[bytes] = field(default_factory=list)

    def add(self, name: str, key: bytes | None, record: Record) -> None:
        self.records.setdefault(name, []).append(record)  # outputs beyond OUTPUTS too (Baseline)
        self.keys.setdefault(name, []).append(key)

    def ids(self, name: str) -> set[str]:
        return {r["event_id"] for r in self.records[name]}

    def unique(self, name: str) -> dict[str, Record]:
        return {r["event_id"]: r for r in self.records[name]}

    def counts(self, name: str) -> Counter[str]:
        return Counter(r["event_id"] for r in self.records[name])


@dataclass
class Comparison:
    """Outputs against a clean run's: missing ids, extra ids or differing copies, identical copies."""

    lost: int
    duplicated: int
    redelivered: int
    detail: str


def compare(got: Collected, expected: dict[str, dict[str, Record]], names: Iterable[str] = OUTPUTS[:-1]) -> Comparison:
    lost = duplicated = redelivered = 0
    notes = []
    for name in names:
        want = expected[name]
        missing = set(want) - got.ids(name)
        extra = got.ids(name) - set(want)
        differing = {r["event_id"] for r in got.records[name]
                     if r["event_id"] in want and comparable(name, r) != comparable(name, want[r["event_id"]])}
        copies = sum(n - 1 for n in got.counts(name).values())
        lost += len(missing)
        duplicated += len(extra) + len(differing)
        redelivered += copies
        if missing or extra or differing:
            notes.append(f"{name}: {len(missing)} missing, {len(extra)} unexpected, {len(differing)} differing"
                         + _first_difference(name, got, want, differing, extra))
    return Comparison(lost, duplicated, redelivered, "; ".join(notes) or "outputs equal a clean run's")


def _first_difference(name: str, got: Collected, want: dict[str, Record], differing: set[str],
                      extra: set[str]) -> str:
    """What differs in the first differing copy (field by field), or the first unexpected id, so a
    failed run says what went wrong and not only how often."""
    if differing:
        event_id = min(differing)
        copy = next(r for r in got.records[name] if r["event_id"] == event_id
                    and comparable(name, r) != comparable(name, want[event_id]))
        fields = sorted(k for k in set(copy) | set(want[event_id])
                        if comparable(name, copy).get(k) != comparable(name, want[event_id]).get(k))
        shown = {k: (_short(copy.get(k)), _short(want[event_id].get(k))) for k in fields[:6]}
        return f" (first: {event_id}, got vs clean run: {shown})"
    if extra:
        record = next(r for r in got.records[name] if r["event_id"] == min(extra))
        return f" (first unexpected: {_short(record)})"
    return ""


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# ------------------------------------------------------------------------------------------ the rig


@dataclass
class Pipeline:
    settings: Settings
    topics: StreamTopics
    workdir: Path
    workers: list[subprocess.Popen] = field(default_factory=list)
    # Workers whose watchdog found them stuck (exit code 3) and that were restarted, as a supervisor would.
    watchdog_restarts: int = 0
    # How many workers that crashed (an unexpected error: the worker stops so that it restarts from its
    # committed offsets) are restarted, as a StatefulSet would; 0 (the default) makes a crash a failure,
    # as it must be where bad input is the test (it is dead-lettered, never a crash). A crash loop still
    # fails: restarts are bounded.
    crash_restarts_allowed: int = 0
    crash_causes: list[str] = field(default_factory=list)  # first errors of each restarted crash

    @classmethod
    def create(cls, base: Settings, workdir: Path, *, partitions: int = 2, tag: str | None = None,
               **processor_overrides: Any) -> Pipeline:
        tag = tag or uuid.uuid4().hex[:8]
        processors = base.processors.model_copy(update={
            "app_id": f"reliability-{tag}", "state_dir": workdir / "state", **processor_overrides})
        settings = base.model_copy(update={
            "kafka": base.kafka.model_copy(update={"partitions": partitions}), "processors": processors})
        topics = StreamTopics(f"reliability-{tag}.")
        report = ensure_stream_topics(settings.kafka, topics)
        if not report.ok:
            raise RuntimeError(f"topics: {report.differences}")
        workdir.mkdir(parents=True, exist_ok=True)
        return cls(settings, topics, workdir)

    def __post_init__(self) -> None:
        self.codec = get_codec()
        self._producer = Producer(producer_config(self.settings.kafka))
        self._consumer: Consumer | None = None
        self._slots: dict[int, int] = {}  # worker pid -> its static membership slot
        self.collected = Collected()

    @property
    def log_path(self) -> Path:
        return self.workdir / "worker.log"

    def topic(self, short: str) -> str:
        return {"calls": self.topics.calls, "env": self.topics.env, "rollouts": self.topics.rollouts}[short]

    def produce(self, events: Iterable[Event]) -> None:
        for name, rec in events:
            topic = self.topics.calls if name == "CallRecord" else self.topics.env
            self.produce_raw(topic, rec["rollout_id"].encode(), self.codec.encode(name, rec))
        self.flush()

    def produce_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        self._producer.produce(topic, key=key, value=value)
        self._producer.poll(0)

    def flush(self) -> None:
        if self._producer.flush(60) != 0:
            raise RuntimeError("input records were not acknowledged by Kafka")

    # -- workers

    def start_worker(self) -> subprocess.Popen:
        # Static membership, as a StatefulSet gives it: the lowest slot no running worker holds, so a
        # restarted worker takes the place of the one that died without waiting out its session.
        taken = {self._slots.get(p.pid) for p in self.workers if p.poll() is None}
        slot = next(n for n in range(len(self.workers) + 1) if n not in taken)
        proc = start_worker_process(self.settings, topic_prefix=self.topics.prefix, log_path=self.log_path,
                                    loglevel="info",
                                    extra_args=["--session-timeout", "6", "--tick", "0.5", "--stall-timeout", "60",
                                                "--instance-id", f"worker-{slot}"])
        self.workers.append(proc)
        self._slots[proc.pid] = slot
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        proc.kill()  # SIGKILL: no commit, no flush, no goodbye to the consumer group
        proc.wait(30)

    def stop_workers(self) -> list[int]:
        return [stop_worker_process(p) for p in self.workers]

    # -- outputs

    def _output_consumer(self) -> Consumer:
        if self._consumer is None:
            consumer = Consumer(consumer_config(self.settings.kafka, f"reliability-read-{uuid.uuid4().hex[:8]}"))
            names = sorted({self.topics.output(n) for n in OUTPUT_SPECS})
            metadata = consumer.list_topics(timeout=30)
            consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in names
                             for p in metadata.topics[t].partitions])
            self._consumer = consumer
        return self._consumer

    def poll(self, timeout_s: float = 0.5) -> int:
        by_topic = {self.topics.output(n): n for n in OUTPUT_SPECS}
        msgs = [m for m in self._output_consumer().consume(500, timeout=timeout_s) if not m.error()]
        for msg in msgs:
            name = by_topic[msg.topic()]
            try:
                self.collected.add(name, msg.key(), self.codec.decode(msg.value(), expect=name)[1])
            except DecodeError:  # bad records put on the rollouts topic by the corpus
                self.collected.undecodable.append(msg.value())
        return len(msgs)

    def collect(self, until: Callable[[Collected], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not until(self.collected):
            self._restart_exited()
            crashed = [p.returncode for p in self.workers if p.poll() not in (None, 0, -9)]
            if crashed or time.monotonic() > deadline:
                return False
            self.poll()
        return True

    def _restart_exited(self) -> None:
        """Restart a worker that stopped itself because it was stuck, or (within ``crash_restarts_allowed``)
        one that crashed, as a production supervisor does; a crash's cause is kept for the report."""
        for proc in list(self.workers):
            code = proc.poll()
            if code == EXIT_STALLED:
                self.watchdog_restarts += 1
            elif code not in (None, 0, -9) and len(self.crash_causes) < self.crash_restarts_allowed:
                own = [line for line in self.log_path.read_text(errors="replace").splitlines()
                       if f"] [{proc.pid}] [" in line or not line.startswith("[")] if self.log_path.exists() else []
                self.crash_causes.append(f"worker {proc.pid} exited with {code}: "
                                         f"{first_errors(own, blocks=1) or '(no error logged)'}")
            else:
                continue
            self.workers.remove(proc)
            self.start_worker()

    def settle(self, quiet_s: float = 3.0) -> Collected:
        last = time.monotonic()
        while time.monotonic() - last < quiet_s:
            if self.poll():
                last = time.monotonic()
        return self.collected

    def log_tail(self, lines: int = 30) -> str:
        return worker_log_tail(self.log_path, lines)

    def close(self, delete: bool = True) -> None:
        self.stop_workers()
        if self._consumer is not None:
            self._consumer.close()
        if delete:
            delete_topics_by_prefix(admin_config(self.settings.kafka),
                                    [self.topics.prefix, f"{self.settings.processors.app_id}-"])


def worker_log_tail(path: Path, lines: int) -> str:
    """The first errors of a worker log, then its last ``lines`` lines, without faust's box-drawn
    partition tables (they crowd out the events that explain a failure).

    A crashed worker ends in a long cascade of cancelled agents; the error that started it comes
    first, so it leads."""
    if not path.exists():
        return "(no worker log)"
    text = [line for line in path.read_text(errors="replace").splitlines()
            if not line.lstrip().startswith(("|", "+", "\u3003"))]
    causes = first_errors(text)
    tail = "\n".join(text[-lines:])
    return f"first errors:\n{causes}\nlast lines:\n{tail}" if causes else tail


def first_errors(lines: list[str], blocks: int = 3, block_lines: int = 25) -> str:
    """The first ``blocks`` ERROR / CRITICAL entries of a log with the traceback lines after each,
    leaving out cancellations (what a crash does to every other task, not its cause)."""
    found: list[str] = []
    i = 0
    while i < len(lines) and len(found) < blocks:
        line = lines[i]
        if ("[ERROR]" in line or "[CRITICAL]" in line) and "CancelledError" not in line \
                and "We experienced a crash" not in line:
            block = [line]
            j = i + 1
            while j < len(lines) and not lines[j].startswith("[") and len(block) < block_lines:
                block.append(lines[j])
                j += 1
            found.append("\n".join(block))
            i = j
        else:
            i += 1
    return "\n".join(found)
