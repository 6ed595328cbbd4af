"""Fault (f), scale-out: two gateway processes and three processor workers on six partitions of a
private broker; one worker is killed -9 once outputs flow, and after the rebalance the outputs must
equal what a single clean worker derives from the same inputs.

Rollouts are driven through both gateways at once (one thread per gateway, the real openai SDK and
the env SDK); the members of every group are spread over both gateways, and every group has an
expected size and is driven in full, so it closes FULL by size, never by a timer, and the outputs
are deterministic. The inputs compared against are the ones actually on the calls / env topics, read
back from the broker after the gateways' spools drained.

The broker is private (own ports and data dir; the shared one is never touched). A worker whose
watchdog stops it (exit code 3, a partition it never fetched after a rebalance) is restarted, as a
supervisor would; the count is reported.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from processors.stream.topics import StreamTopics, ensure_stream_topics
from reliability.pipeline import Event, Pipeline, compare, core_outputs
from reliability.results import FaultResult
from schemas.codec import DecodeError, get_codec
from schemas.ids import call_id
from schemas.kafka.config import admin_config, consumer_config
from tokentrail import kafka_local
from tokentrail.settings import KafkaSettings, Settings

Progress = Callable[[str], None]
NAME = "f. scale-out: 2 gateways, 3 workers, 6 partitions, one worker killed"
PARTITIONS = 6
WORKERS = 3
GATEWAYS = 2


@dataclass(frozen=True)
class ScaleSizes:
    groups: int  # half are driven before the kill, half after
    group_size: int  # members of one group, alternating between the two gateways
    calls_per_rollout: int


QUICK = ScaleSizes(groups=6, group_size=4, calls_per_rollout=2)
FULL = ScaleSizes(groups=12, group_size=4, calls_per_rollout=3)


@dataclass
class ScaleOutRun:
    """The fault's result plus what the test checks beyond lost / duplicated."""

    result: FaultResult
    # Calls-topic partitions of each consumer-group member, described just before the kill / at the end.
    assignment_before_kill: list[list[int]] = field(default_factory=list)
    assignment_after: list[list[int]] = field(default_factory=list)
    watchdog_restarts: int = 0
    killed_pid: int | None = None


def spread_over(assignment: list[list[int]], members: int, partitions: int) -> bool:
    """Every one of ``members`` workers owns at least one partition, and together they own them all."""
    owned = [p for member in assignment for p in member]
    return (len(assignment) == members and all(assignment) and sorted(owned) == list(range(partitions)))


# ------------------------------------------------------------------------------------ driving


def task_input(member: int) -> dict[str, str]:
    """Even members accept any answer, odd ones want "4": the tiny model's rewards then differ within a
    group, so groups are not filtered for zero variance and samples are derived."""
    return {"answer": "(?s).*", "answer_mode": "regex"} if member % 2 == 0 else {"answer": "4"}


class GatewayDriver:
    """One thread per gateway: drives its share of each group's members, the groups in order; stops at
    ``gate_at`` until ``gate`` is set (so half the groups are driven after the kill)."""

    def __init__(self, index: int, url: str, model: str, sizes: ScaleSizes, tag: str,
                 gate: threading.Event, gate_at: int) -> None:
        self.index, self.url, self.model, self.sizes, self.tag = index, url, model, sizes, tag
        self.gate, self.gate_at = gate, gate_at
        self.acked: set[str] = set()  # ids of every record the gateway acknowledged
        self.done = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, name=f"scale-out-gateway-{index}", daemon=True)

    def _run(self) -> None:
        for g in range(self.sizes.groups):
            if g == self.gate_at:
                self.gate.wait()
            for k in range(self.index, self.sizes.group_size, GATEWAYS):
                try:
                    self.acked |= self._rollout(g, k)
                    self.done += 1
                except Exception as exc:  # reported as a failure of the scenario
                    self.errors.append(f"gateway {self.index}, group {g} member {k}: {exc!r}")

    def _rollout(self, g: int, k: int) -> set[str]:
        from producers.sdk import Rollout

        with Rollout(self.url, rollout_id=f"scale-{self.tag}-g{g}-r{k}", group_id=f"scale-{self.tag}-g{g}",
                     expected_group_size=self.sizes.group_size, task_input=task_input(k),
                     timeout_s=120) as rollout:
            ids = {rollout.started["event_id"]} if rollout.started else set()
            client = rollout.openai_client(max_retries=0, timeout=120)
            messages: list[Any] = [{"role": "user", "content": f"group {g}, member {k}: what is 2 + 2?"}]
            for i in range(self.sizes.calls_per_rollout):
                reply = client.chat.completions.create(model=self.model, messages=messages, max_tokens=4)
                messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                             {"role": "user", "content": "and again?"}]
                ids.add(call_id(rollout.rollout_id, rollout.attempt_id, i))
            ids.add(rollout.event("TOOL_RESULT", {"g": g, "k": k},
                                  call_index=self.sizes.calls_per_rollout - 1)["event_id"])
            ids.add(rollout.finish("SUCCESS")["event_id"])
        return ids


# ------------------------------------------------------------------------------------ reading back


def read_inputs(settings: Settings, topics: StreamTopics, timeout_s: float = 60.0) -> list[Event]:
    """Every record on the calls and env topics up to their current end, in broker-timestamp order."""
    consumer = Consumer(consumer_config(settings.kafka, f"reliability-read-{uuid.uuid4().hex[:8]}",
                                        **{"isolation.level": "read_committed"}))
    codec = get_codec()
    found: list[tuple[tuple[int, str, int, int], Event]] = []
    try:
        metadata = consumer.list_topics(timeout=30)
        tps = [TopicPartition(t, p) for t in (topics.calls, topics.env) for p in metadata.topics[t].partitions]
        ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in tps}
        consumer.assign([TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in tps])
        waiting = {key for key, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error():
                    continue
                key = (msg.topic(), msg.partition())
                if msg.offset() + 1 >= ends[key]:
                    waiting.discard(key)
                try:
                    event = codec.decode(msg.value())
                except DecodeError:
                    continue  # the gateways write only valid records; a bad one shows up as a lost id
                found.append(((msg.timestamp()[1], msg.topic(), msg.partition(), msg.offset()), event))
        if waiting:
            raise RuntimeError(f"could not read the inputs to their end: {sorted(waiting)}")
    finally:
        consumer.close()
    return [event for _, event in sorted(found, key=lambda item: item[0])]


def describe_assignment(admin: AdminClient, group_id: str, topic: str) -> list[list[int]]:
    """Partitions of ``topic`` held by each member of the consumer group (sorted)."""
    group = admin.describe_consumer_groups([group_id])[group_id].result(timeout=30)
    return sorted(sorted(tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic)
                  for m in group.members)


def _wait_spools_drained(urls: list[Callable[[], dict[str, Any]]], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(health().get("sink", {}).get("spool_depth", 1) == 0 for health in urls):
            return True
        time.sleep(0.5)
    return False


def _covered_or_stuck(expected: dict[str, dict[str, Any]], names: list[str],
                      quiet_s: float = 20.0) -> Callable[[Any], bool]:
    """Done when every expected output is seen, or (a dead letter seen) when nothing new came for
    ``quiet_s``: a dead-lettered group never completes, so waiting the full timeout tells nothing more."""
    last = [0, time.monotonic()]

    def done(collected: Any) -> bool:
        if all(set(expected[n]) <= collected.ids(n) for n in names):
            return True
        seen = sum(len(v) for v in collected.records.values())
        if seen != last[0]:
            last[:] = [seen, time.monotonic()]
        return bool(collected.records["DeadLetter"]) and time.monotonic() - last[1] > quiet_s

    return done


# ------------------------------------------------------------------------------------ the scenario


def private_settings(settings: Settings, workdir: Path, tag: str) -> Settings:
    """Settings for a private 6-partition broker on free ports; groups and attempts that never time out
    within a run (they close by size), so the outputs do not depend on how loaded the machine is."""
    from reliability.faults import free_port

    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", controller_port=free_port(),
                          data_dir=workdir / "kafka", heap="512m", partitions=PARTITIONS,
                          lib_dir=settings.kafka.lib_dir)
    processors = settings.processors.model_copy(update={
        "app_id": f"scale-out-{tag}", "state_dir": workdir / "state",
        "group_window_s": 3600.0, "attempt_timeout_s": 3600.0})
    return settings.model_copy(update={"kafka": kafka, "processors": processors})


def scale_out(settings: Settings, workdir: Path, sizes: ScaleSizes, progress: Progress, seed: int = 0) -> FaultResult:
    return run_scale_out(settings, workdir, sizes, progress, seed).result


def run_scale_out(settings: Settings, workdir: Path, sizes: ScaleSizes, progress: Progress,
                  seed: int = 0) -> ScaleOutRun:
    from reliability.faults import GatewayProcess, free_port

    workdir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    private = private_settings(settings, workdir, tag)
    kafka = private.kafka
    quiet: Progress = lambda _line: None  # noqa: E731
    t0 = time.monotonic()
    kafka_local.start(wait_s=180, kafka=kafka, echo=quiet)
    gateways: list[GatewayProcess] = []
    pipeline: Pipeline | None = None
    try:
        topics = StreamTopics("")
        report = ensure_stream_topics(private.kafka, topics)
        if not report.ok:
            raise RuntimeError(f"topics: {report.differences}")
        pipeline = Pipeline(private, topics, workdir)
        for i in range(GATEWAYS):
            gw = private.gateway.model_copy(update={"port": free_port(), "spool_dir": workdir / f"spool-{i}"})
            gateways.append(GatewayProcess(private.model_copy(update={"gateway": gw}), workdir / f"gateway-{i}.log"))
        for gateway in gateways:  # one at a time: two model loads at once crowd a small machine
            gateway.start()
        for _ in range(WORKERS):
            pipeline.start_worker()
        progress(f"fault f: private broker on {kafka.bootstrap_servers} ({PARTITIONS} partitions), "
                 f"{GATEWAYS} gateways and {WORKERS} workers started ({time.monotonic() - t0:.0f}s)")
        return _drive_kill_compare(private, pipeline, gateways, sizes, progress, seed, tag, t0)
    finally:
        for gateway in gateways:
            gateway.stop()
        if pipeline is not None:
            pipeline.close(delete=False)  # the whole broker goes below
        kafka_local.stop(timeout_s=60, kafka=kafka, echo=quiet)


def _drive_kill_compare(private: Settings, pipeline: Pipeline, gateways: list[Any], sizes: ScaleSizes,
                        progress: Progress, seed: int, tag: str, t0: float) -> ScaleOutRun:
    rng = np.random.default_rng(seed)
    admin = AdminClient(admin_config(private.kafka))
    app_id = private.processors.app_id
    calls_topic = pipeline.topics.calls
    notes: list[str] = []

    def assignment() -> list[list[int]]:
        try:
            return describe_assignment(admin, app_id, calls_topic)
        except Exception as exc:  # the group may be between generations; described again below
            notes.append(f"describe: {exc!r}")
            return []

    def wait_for_spread(timeout_s: float) -> list[list[int]]:
        """Supervise and collect until every worker owns input partitions; the last assignment seen."""
        seen: list[list[list[int]]] = [[]]

        def spread(_collected: object) -> bool:
            seen[0] = assignment()
            return spread_over(seen[0], WORKERS, PARTITIONS)

        pipeline.collect(spread, timeout_s=timeout_s)
        return seen[0]

    spread = wait_for_spread(180)
    progress(f"fault f: partitions of {calls_topic} per worker: {spread} ({time.monotonic() - t0:.0f}s)")

    gate = threading.Event()
    drivers = [GatewayDriver(i, gw.url, private.model.name, sizes, tag, gate, gate_at=(sizes.groups + 1) // 2)
               for i, gw in enumerate(gateways)]
    for driver in drivers:
        driver.thread.start()
    flowing = pipeline.collect(lambda c: bool(c.records["Score"]), timeout_s=240)  # a group was scored
    before_kill = wait_for_spread(30)  # what the group looks like at the moment of the kill
    live = [p for p in pipeline.workers if p.poll() is None]
    victim = live[int(rng.integers(len(live)))] if live else None
    if victim is not None:
        pipeline.kill(victim)
    gate.set()
    progress(f"fault f: outputs flowing ({len(pipeline.collected.records['Score'])} scores); worker pid "
             f"{victim.pid if victim else '-'} killed -9 with assignment {before_kill}; driving the rest")

    pipeline.collect(lambda _c: not any(d.thread.is_alive() for d in drivers), timeout_s=600)
    for driver in drivers:  # returns at once unless a worker crashed or the drive timed out
        driver.thread.join(300)
    drained = _wait_spools_drained([gw.health for gw in gateways], 120)
    inputs = read_inputs(private, pipeline.topics)
    acked = set().union(*(d.acked for d in drivers))
    on_topics = Counter(rec["event_id"] for _, rec in inputs)
    lost_inputs = len(acked - set(on_topics))
    dup_inputs = sum(n - 1 for n in on_topics.values())
    expected = core_outputs(inputs, private)
    names = [n for n in expected if n != "DeadLetter"]
    full_groups = sum(g["status"] == "FULL" for g in expected["RolloutGroup"].values())
    progress(f"fault f: {sum(d.done for d in drivers)} rollouts driven, {len(inputs)} input records on Kafka; "
             f"waiting for {len(expected['Sample'])} samples of {full_groups} full groups")
    pipeline.collect(_covered_or_stuck(expected, names), timeout_s=300)
    got = pipeline.settle(quiet_s=3.0)
    covered = all(set(expected[n]) <= got.ids(n) for n in names)
    after = assignment()
    cmp = compare(got, expected, names)
    dead = len(got.records["DeadLetter"])
    crashed = [p.returncode for p in pipeline.workers if p.poll() not in (None, 0, -9)]
    errors = [e for d in drivers for e in d.errors]
    lost = cmp.lost + lost_inputs
    duplicated = cmp.duplicated + dead + dup_inputs
    passed = (lost == duplicated == 0 and covered and flowing and drained and not errors and not crashed
              and victim is not None and spread_over(before_kill, WORKERS, PARTITIONS)
              and full_groups == sizes.groups and bool(expected["Sample"]))
    detail = cmp.detail + f"; assignment before the kill {before_kill}, after {after}"
    if pipeline.watchdog_restarts:
        detail += f"; {pipeline.watchdog_restarts} watchdog restart(s) of a stuck worker"
    for failed, why in ((not flowing, "no score within 240s of driving"), (not drained, "a spool did not drain"),
                        (not covered, "outputs did not cover the expected ones (300s at most)"),
                        (bool(crashed), f"workers exited with {crashed}"),
                        (lost_inputs > 0, f"{lost_inputs} acknowledged input records not on Kafka"),
                        (dup_inputs > 0, f"{dup_inputs} extra copies of input records"),
                        (dead > 0, f"{dead} dead letters"),
                        (full_groups != sizes.groups, f"{full_groups} of {sizes.groups} groups FULL"),
                        (bool(errors), "; ".join(errors[:3]))):
        if failed:
            detail += f"; {why}"
    if not passed:
        detail += ("; " + "; ".join(notes[-3:])) if notes else ""
        for letter in got.records["DeadLetter"][:5]:
            detail += f"\ndead letter from {letter['stage']} ({letter['source_topic']}[{letter['partition']}] " \
                      f"@{letter['offset']}): {letter['reason']}"
        detail += f"\nworker log (last lines):\n{pipeline.log_tail(80)}"
    result = FaultResult(
        NAME, f"{sum(d.done for d in drivers)} rollouts in {sizes.groups} groups of {sizes.group_size} over "
        f"{GATEWAYS} gateways, {len(inputs)} input records ({len(expected['Sample'])} samples expected), "
        f"worker killed -9 mid-run", lost, duplicated, passed, detail, cmp.redelivered, time.monotonic() - t0)
    progress(f"fault f: lost {lost}, duplicated {duplicated} ({cmp.redelivered} identical redeliveries, "
             f"{pipeline.watchdog_restarts} watchdog restarts)")
    return ScaleOutRun(result, before_kill, after, pipeline.watchdog_restarts, victim.pid if victim else None)
