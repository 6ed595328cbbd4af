"""The freshness benchmark's workload: rollouts that finish on a schedule, produced in real time.

Each rollout is a small attempt (start, ``calls`` model calls, one env step per call, finish) whose
events carry wall-clock event times: a rollout due to finish at F has its last record (its last call's
end) at F and the others a few milliseconds before, so the CompletedRollout's own ``created_at_us``
(the latest input time) is F. Every record is produced when its own time comes (a producer behind
its schedule shows up in "call -> on Kafka", never hidden). Rollout ids name their phase, so one run's
topics hold every phase and the measurement sorts them apart afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from confluent_kafka import Producer

from processors.stream.topics import StreamTopics
from schemas.builders import make_call
from schemas.codec import Codec
from testkit.stages import AttemptSpec, attempt_events, growing_turns

Event = tuple[str, dict[str, Any]]

CALL_US = round(1000 * make_call.__kwdefaults__["total_ms"])  # a built call's total_ms


def event_time_us(name: str, record: dict[str, Any]) -> int:
    """When an event happened: a call when it ended, anything else when it was created."""
    if name == "CallRecord":
        timings = record["timings"]
        return int(timings["received_at_us"]) + round(float(timings["total_ms"]) * 1000)
    return int(record["created_at_us"])


@dataclass(frozen=True)
class Phase:
    """``groups`` groups of ``group_size`` rollouts finishing ``rate`` per second (0: all at once)."""

    name: str
    rate: float
    group_size: int
    groups: int

    @property
    def rollouts(self) -> int:
        return self.groups * self.group_size


def rollout_id(tag: str, phase: str, group: int, member: int) -> str:
    return f"{tag}-{phase}-g{group}-r{member}"


def phase_events(tag: str, phase: Phase, start_us: int, calls: int, prompt: int, output: int,
                 seed: int) -> list[tuple[int, Event]]:
    """(due time in µs, event) for every record of the phase, sorted by due time.

    Members of a group finish one after the other; a group's answers alternate right / wrong, so the
    group has reward variance and yields samples."""
    rng = np.random.default_rng(seed)
    # attempt_events stamps call i received at t0 + (i + 1) ms, done CALL_MS later, the finish at
    # t0 + (calls + 2) ms: the latest of those is the rollout's finish.
    span_us = max(1000 * (calls + 2), 1000 * calls + CALL_US)
    timed: list[tuple[int, Event]] = []
    for g in range(phase.groups):
        for k in range(phase.group_size):
            n = g * phase.group_size + k
            finish_us = start_us + (round(n * 1e6 / phase.rate) if phase.rate > 0 else 0)
            texts = [f"turn {i}" for i in range(calls - 1)] + ["The answer is 4" if k % 2 else "It is 5"]
            turns = growing_turns(rng, calls, prompt, output, tool_len=8, texts=texts)
            spec = AttemptSpec(rollout_id(tag, phase.name, g, k), "a1", turns, env_events=calls,
                               group_id=f"{tag}-{phase.name}-g{g}", expected_group_size=phase.group_size,
                               task_input={"answer": "4"}, t0_us=finish_us - span_us)
            for name, record in attempt_events(spec):
                timed.append((event_time_us(name, record), (name, record)))
    timed.sort(key=lambda item: item[0])
    return timed


class ScheduledProducer:
    """Produces each event when its due time comes (the harness and the gateway, in real time)."""

    def __init__(self, producer_conf: dict[str, Any], topics: StreamTopics, codec: Codec) -> None:
        self.producer = Producer(producer_conf)
        self.topics = topics
        self.codec = codec
        self.max_lag_us = 0  # how far behind its schedule the producer fell

    def run(self, timed: list[tuple[int, Event]]) -> None:
        for due_us, (name, record) in timed:
            wait_s = due_us / 1e6 - time.time()
            if wait_s > 0:
                self.producer.poll(0)
                time.sleep(wait_s)
            else:
                self.max_lag_us = max(self.max_lag_us, round(-wait_s * 1e6))
            topic = self.topics.calls if name == "CallRecord" else self.topics.env
            value = self.codec.encode(name, record)
            while True:
                try:
                    self.producer.produce(topic, key=record["rollout_id"].encode(), value=value)
                    break
                except BufferError:  # local queue full: let it drain
                    self.producer.poll(0.05)
            self.producer.poll(0)
        self.producer.flush(60)
