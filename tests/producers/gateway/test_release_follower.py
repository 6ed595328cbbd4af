"""The gateway's release follower on the real broker: unreadable and stale records are skipped and the fold
goes on; a decisions topic that does not exist makes routed calls fail with a clear 503, not a guess."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from processors.release.controller import initial_state, manual_decision, start_decision
from processors.release.events import decision_record
from processors.release.plan import load_plan
from processors.stream.release_controller import publish_decision
from producers.gateway.release_routed import ReleaseRoutedUpstream, session_key
from producers.upstreams.base import UpstreamError
from schemas.kafka.config import producer_config
from schemas.kafka.release_follower import ReleaseFollower
from tokentrail.settings import Settings

PLAN = load_plan({"ramp": [0.2, 0.6]})


def _wait(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_unreadable_and_stale_records_are_skipped(tokentrail_settings: Settings, kafka_bootstrap: str,
                                                  new_topic: Callable[..., str]) -> None:
    kafka, topic = tokentrail_settings.kafka, new_topic(partitions=1)
    state = initial_state("track", PLAN, serving_version=2)
    start, state = decision_record(state, start_decision(state, 3, "test", plan=PLAN), created_at_us=1)
    publish_decision(kafka, topic, start)
    producer = Producer(producer_config(kafka))
    producer.produce(topic, key=b"track", value=b"not avro at all")
    assert producer.flush(30) == 0
    publish_decision(kafka, topic, dict(start, event_id="a-late-copy"))  # sequence 0 again: stale
    follower = ReleaseFollower(kafka, "track", topic, poll_s=0.05).start()
    try:
        _wait(follower.caught_up.is_set)
        status: dict[str, Any] = follower.status()
        assert (status["decisions_read"], status["unreadable"], status["stale"]) == (2, 1, 1)
        assert status["traffic"]["candidate_version"] == 3 and status["traffic"]["candidate_fraction"] == 0.2
        promote, state = decision_record(state, manual_decision(state, "promote", "test"), created_at_us=2)
        publish_decision(kafka, topic, promote)  # read after the catch-up: followed as it arrives
        _wait(lambda: (t := follower.traffic()) is not None and t.serving_version == 3)
        traffic = follower.traffic()
        assert traffic is not None and traffic.candidate_version is None and traffic.sequence == 2
    finally:
        follower.close()


def test_a_missing_decisions_topic_is_a_clear_503(tokentrail_settings: Settings, kafka_bootstrap: str) -> None:
    topic = f"test.no-such-decisions.{uuid.uuid4().hex[:8]}"
    follower = ReleaseFollower(tokentrail_settings.kafka, "track", topic).start()
    routed = ReleaseRoutedUpstream(inner=None, follower=follower, ready_timeout_s=1.0)  # type: ignore[arg-type]
    try:
        with pytest.raises(UpstreamError) as info:
            asyncio.run(routed.version_for("rollout-1"))
        assert info.value.status_code == 503 and info.value.error_type == "release_plan_unavailable"
        assert topic in str(info.value)
    finally:
        follower.close()


def test_the_session_key_is_the_rollout_else_the_harness_session() -> None:
    assert session_key("r-1", "s-1") == "r-1"
    assert session_key("unattributed", "s-1") == "session:s-1"
    assert session_key("unattributed", None) == ""
