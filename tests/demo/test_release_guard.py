"""The release guard of the main demo: the controller runs as a service (as ``tokentrail demo`` starts it),
follows the calls of a release in progress, stops cleanly on SIGTERM with its last counts, and the demo reads
them from its log. Real broker, real ``tokentrail release control`` process."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from demo import release_guard
from processors.release.controller import initial_state, start_decision
from processors.release.events import decision_record
from processors.release.plan import load_plan
from processors.stream.release_controller import publish_decision
from schemas.builders import make_call
from schemas.codec import get_codec
from schemas.kafka.config import producer_config
from tokentrail.settings import Settings

pytestmark = pytest.mark.e2e

PLAN = load_plan({"ramp": [0.5]})


def test_the_controller_service_stops_cleanly_and_the_demo_reads_its_counts(
        tokentrail_settings: Settings, kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path) -> None:
    kafka = tokentrail_settings.kafka
    decisions, calls, rewards = new_topic(partitions=1), new_topic(partitions=1), new_topic(partitions=1)
    state = initial_state("tiny", PLAN, serving_version=0)  # "tiny": the model make_call records
    start, _ = decision_record(state, start_decision(state, 1, "test", plan=PLAN), created_at_us=time.time_ns() // 1000)
    publish_decision(kafka, decisions, start)
    service = release_guard.controller_service(tmp_path)
    service.argv += ["--topic", decisions, "--calls-topic", calls, "--rewards-topic", rewards,
                     "--progress-every", "0.5"]
    service.start()
    try:
        # A release is in progress: the controller re-reads calls from its start, so these count however
        # soon after its start they arrive.
        producer = Producer(producer_config(kafka))
        for i in range(3):
            record = make_call(f"guard-{i}", "a0", 0, [1, 2, 3], [4], policy_version=i % 2)
            producer.produce(calls, value=get_codec().encode("CallRecord", record))
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 90
        while release_guard.guard_summary(service.log_path).get("release_controller_calls") != 3:
            assert service.alive() and time.monotonic() < deadline, service.tail()
            time.sleep(0.2)
    finally:
        code = service.stop()
    assert code == 0, service.tail()  # SIGTERM is a clean stop, not a kill
    summary = release_guard.guard_summary(service.log_path)
    assert summary == {"release_controller_calls": 3, "release_controller_rewards": 0, "release_decisions": 1}
    assert "3 calls and 0 rewards, 1 release decisions" in release_guard.guard_line(summary)
    assert release_guard.guard_summary(tmp_path / "missing.log") == {}
