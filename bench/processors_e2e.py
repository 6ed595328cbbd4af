"""End-to-end processors figure: sample tokens per second through Kafka and one faust worker.

Timed: from the first input event produced (calls + env events of whole groups) to the last of
their samples consumed from the samples topic, through a worker subprocess (``tokentrail process``)
on private, prefixed topics of the local broker. The worker is warmed up first (start-up, consumer
group join, one group through), so the figure is steady-state throughput on this machine.
Needs a running broker (``tokentrail kafka start``); without one the figure is skipped.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from processors.assembler import RolloutAssembly
from processors.grouper import GrouperState
from processors.isolation.calls import verifier_runner
from processors.pipeline import StageConfigs, process_group
from processors.stream.topics import StreamTopics, ensure_stream_topics
from processors.stream.worker_config import load_grouping
from processors.verifiers import load_verifiers
from schemas.codec import get_codec
from schemas.kafka.config import admin_config, consumer_config, producer_config
from testkit.kafka_read import delete_topics_by_prefix
from testkit.stages import AttemptSpec, attempt_events, growing_turns
from tokentrail import kafka_local
from tokentrail.runtime.process import start_worker_process, stop_worker_process
from tokentrail.settings import Settings, get_settings

Event = tuple[str, dict[str, Any]]


def group_workload(tag: str, groups: int, group_size: int, calls: int, first_prompt: int, output: int,
                   tool: int, seed: int) -> list[Event]:
    """Multi-turn rollouts whose last answers alternate right / wrong, so every group yields samples."""
    rng = np.random.default_rng(seed)
    events: list[Event] = []
    for g in range(groups):
        for k in range(group_size):
            texts = [f"turn {i}" for i in range(calls - 1)] + ["The answer is 4" if k % 2 else "It is 5"]
            turns = growing_turns(rng, calls, first_prompt, output, tool, texts=texts)
            events += attempt_events(AttemptSpec(f"{tag}-g{g}-r{k}", "a1", turns, env_events=calls,
                                                 group_id=f"{tag}-g{g}", expected_group_size=group_size,
                                                 task_input={"answer": "4"}))
    return events


def expected_samples(settings: Settings, events: list[Event]) -> dict[str, int]:
    """Sample event id -> tokens, as the pure core derives them for these events."""
    proc = settings.processors
    stages = StageConfigs.load(proc.reward_config, proc.credit_config, proc.sample_config)
    grouping, verifiers = load_grouping(proc), load_verifiers(list(proc.verifiers))
    states: dict[str, RolloutAssembly] = {}
    grouper, rollouts, samples = GrouperState(), {}, {}
    for name, rec in events:
        state = states.setdefault(rec["rollout_id"], RolloutAssembly(rec["rollout_id"]))
        for rollout in state.accept(name, rec).rollouts:
            rollouts[rollout["event_id"]] = rollout
            for emitted in grouper.add(rollout, grouping).emitted:
                members = [rollouts[e] for e in emitted.group["rollout_event_ids"]]
                derived = process_group(emitted.group, members, verifiers, stages.reward, stages.credit,
                                        stages.sample, runner=verifier_runner())
                samples.update({s["event_id"]: len(s["input_ids"]) // 4 for s in derived.samples})
    return samples


class _Pipeline:
    def __init__(self, settings: Settings, topics: StreamTopics) -> None:
        self.settings, self.topics, self.codec = settings, topics, get_codec()
        self.producer = Producer(producer_config(settings.kafka))
        self.consumer = Consumer(consumer_config(settings.kafka, f"bench-{uuid.uuid4().hex[:8]}"))
        samples = topics.output("Sample")
        parts = self.consumer.list_topics(samples, timeout=30).topics[samples].partitions
        self.consumer.assign([TopicPartition(samples, p, OFFSET_BEGINNING) for p in parts])
        self.seen: set[str] = set()

    def produce(self, events: list[Event]) -> None:
        for name, rec in events:
            topic = self.topics.calls if name == "CallRecord" else self.topics.env
            while True:
                try:
                    self.producer.produce(topic, key=rec["rollout_id"].encode(), value=self.codec.encode(name, rec))
                    break
                except BufferError:  # local queue full: let it drain
                    self.producer.poll(0.1)
            self.producer.poll(0)
        self.producer.flush(60)

    def wait_for(self, sample_ids: set[str], timeout_s: float, worker: Any, log_path: Path) -> None:
        deadline = time.monotonic() + timeout_s
        while not sample_ids <= self.seen:
            if worker.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
                raise RuntimeError(f"e2e: {len(sample_ids - self.seen)} samples missing\n{tail}")
            for msg in self.consumer.consume(200, timeout=0.2):
                if not msg.error():
                    self.seen.add(self.codec.decode(msg.value(), expect="Sample")[1]["event_id"])


def measure(groups: int = 2, group_size: int = 4, calls: int = 16, first_prompt: int = 2048, output: int = 512,
            tool: int = 1500, timeout_s: float = 600.0) -> float | None:
    """Sample tokens per second, input produced to samples consumed; None without a broker."""
    base = get_settings()
    if not kafka_local.broker_answers(base.kafka):
        print(f"  e2e: no Kafka broker answers on {base.kafka.bootstrap_servers}; skipped "
              "(start one with `tokentrail kafka start`)", flush=True)
        return None
    tag = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix="tokentrail-bench-e2e-"))
    settings = base.model_copy(update={"processors": base.processors.model_copy(update={
        "app_id": f"bench-e2e-{tag}", "state_dir": workdir / "state"})})
    topics = StreamTopics(f"bench-{tag}.")
    ensure_stream_topics(settings.kafka, topics)
    log_path = workdir / "worker.log"
    worker = start_worker_process(settings, topic_prefix=topics.prefix, log_path=log_path, loglevel="warning")
    try:
        pipe = _Pipeline(settings, topics)
        warm = group_workload("warm", 1, group_size, calls, first_prompt, output, tool, seed=1)
        timed = group_workload("timed", groups, group_size, calls, first_prompt, output, tool, seed=2)
        warm_samples, timed_samples = expected_samples(settings, warm), expected_samples(settings, timed)
        print(f"  e2e: warming up the worker ({len(warm)} events) ...", flush=True)
        pipe.produce(warm)
        pipe.wait_for(set(warm_samples), timeout_s, worker, log_path)
        tokens = sum(timed_samples.values())
        print(f"  e2e: {len(timed)} events -> {len(timed_samples)} samples ({tokens:,} tokens) ...", flush=True)
        start = time.perf_counter()
        pipe.produce(timed)
        pipe.wait_for(set(timed_samples), timeout_s, worker, log_path)
        elapsed = time.perf_counter() - start
        print(f"  e2e: {elapsed:.2f} s, {len(timed) / elapsed:.0f} events/s", flush=True)
        pipe.consumer.close()
        return round(tokens / elapsed)
    finally:
        stop_worker_process(worker)
        delete_topics_by_prefix(admin_config(settings.kafka), [topics.prefix, f"{settings.processors.app_id}-"])
