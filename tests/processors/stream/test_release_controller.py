"""The release controller as a stream processor on the real broker: an operator starts a release, the
controller reads calls and rewards, ramps, is restarted mid-release, and promotes; a bad record is skipped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer

from processors.stream.release_controller import ControllerTopics, read_decisions, run_controller
from schemas.builders import make_call
from schemas.codec import get_codec
from schemas.ids import event_id
from schemas.kafka.config import producer_config
from tests.conftest import NewTopicFactory
from tokentrail.cli import main
from tokentrail.settings import Settings


def _produce(settings: Settings, topics: ControllerTopics, start: int, n: int, seed: int) -> None:
    """``n`` rollouts, each one call and one reward; odd ones on the candidate (5), which is better."""
    codec = get_codec()
    rng = np.random.default_rng(seed)
    producer = Producer(producer_config(settings.kafka))
    for i in range(start, start + n):
        rid = f"rollout-{i}"
        version = 5 if i % 2 else 4
        call = make_call(rid, "a0", 0, [1, 2, 3], [4, 5], policy_version=version, total_ms=float(rng.uniform(50, 80)))
        raw = float(rng.random() < (0.7 if version == 5 else 0.4))
        reward = {"event_id": event_id("reward", rid), "rollout_id": rid, "group_id": "g", "reward_config_id": "c",
                  "score_ids": [], "raw_reward": raw, "reward": 0.0, "components_json": "{}", "filtered": False,
                  "filter_reason": None, "created_at_us": 1_700_000_000_000_000 + i}
        producer.produce(topics.calls, key=rid.encode(), value=codec.encode("CallRecord", call))
        producer.produce(topics.rewards, key=rid.encode(), value=codec.encode("Reward", reward))
    assert producer.flush(30) == 0


def _actions(settings: Settings, topics: ControllerTopics) -> list[tuple[str, str]]:
    return [(r["action"], r["source"]) for r in read_decisions(settings.kafka, topics.decisions, 10.0).records]


def test_the_controller_ramps_survives_a_restart_and_promotes(
    kafka_bootstrap: str, new_topic: NewTopicFactory, tokentrail_settings: Settings, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = tokentrail_settings
    topics = ControllerTopics(new_topic(partitions=2), new_topic(partitions=2), new_topic(partitions=1))
    plan = tmp_path / "plan.yaml"
    plan.write_text("ramp: [0.2, 0.5]\nguard_rails: {min_samples_per_arm: 30, min_samples_per_stage: 30, "
                    "min_calls_per_arm: 30}\n")
    assert main(["release", "start", "--topic", topics.decisions, "--model", "tiny", "--serving", "4",
                 "--candidate", "5", "--plan", str(plan), "--operator", "ops"]) == 0

    _produce(settings, topics, 0, 70, seed=1)
    producer = Producer(producer_config(settings.kafka))
    producer.produce(topics.rewards, key=b"x", value=b"not avro")
    assert producer.flush(30) == 0
    lines: list[str] = []
    feed = run_controller(settings.kafka, topics, idle_s=1.0, progress_every_s=0.5, timeout_s=10.0,
                          log=lines.append)
    assert _actions(settings, topics) == [("start", "operator"), ("ramp", "controller")]
    assert feed.states["tiny"].stage == 1 and feed.counts["rewards"] == 70
    assert feed.skipped == {"unreadable record (CorruptRecord)": 1}
    assert any("decision 1 on 'tiny': ramp" in line for line in lines)
    assert "candidate 5 at 50%" in lines[-1]

    # A new controller rebuilds its state from the topics (the release's calls and rewards from its start).
    _produce(settings, topics, 70, 330, seed=2)
    lines.clear()
    feed = run_controller(settings.kafka, topics, idle_s=1.0, progress_every_s=5.0, timeout_s=10.0,
                          log=lines.append)
    assert "releases in progress: tiny (candidate 5)" in lines[0]
    assert _actions(settings, topics) == [("start", "operator"), ("ramp", "controller"), ("promote", "controller")]
    assert feed.counts["rewards"] == 400  # every reward counted once, from the release's start
    promote = read_decisions(settings.kafka, topics.decisions, 10.0).records[-1]
    assert promote["rule"] == "reward_better" and promote["interval_low"] > 0
    assert (feed.states["tiny"].serving_version, feed.states["tiny"].candidate_version) == (5, None)

    capsys.readouterr()
    assert main(["release", "status", "--topic", topics.decisions]) == 0
    assert "tiny: serving version 5 to all sessions" in capsys.readouterr().out
    # Once more: nothing in progress, so nothing to decide and nothing written twice.
    run_controller(settings.kafka, topics, idle_s=1.0, timeout_s=10.0, log=lines.append)
    assert len(_actions(settings, topics)) == 3
