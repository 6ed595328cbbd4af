"""``tokentrail release`` on the real broker: operators' and the controller's decisions on one topic, folded
back by ``status``; refused decisions are CLI errors; unreadable records and lost races are skipped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer

from processors.release.arms import RewardObservation
from processors.release.controller import decide, fold_reward
from processors.release.events import DecisionLog, decision_record
from processors.stream.release_controller import publish_decision, read_decisions
from schemas.kafka.config import producer_config
from tests.conftest import NewTopicFactory
from tokentrail.cli import main
from tokentrail.settings import Settings


def _status(topic: str, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert main(["release", "status", "--topic", topic, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_release_lifecycle_through_the_topic(
    kafka_bootstrap: str, new_topic: NewTopicFactory, tokentrail_settings: Settings, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = new_topic(partitions=1)
    base = ["--topic", topic, "--model", "policy-a", "--operator", "alice"]
    kafka = tokentrail_settings.kafka

    assert main(["release", "status", "--topic", topic]) == 0
    assert "no release decisions" in capsys.readouterr().out
    assert main(["release", "promote", *base]) == 2
    assert "has no release decisions" in capsys.readouterr().err
    assert main(["release", "start", *base, "--candidate", "5"]) == 2
    assert "give its serving version with --serving" in capsys.readouterr().err
    bad_plan = tmp_path / "plan.yaml"
    bad_plan.write_text("ramp: [0.5, 0.1]\n")
    assert main(["release", "start", *base, "--candidate", "5", "--serving", "4", "--plan", str(bad_plan)]) == 2
    assert "ramp fractions must be strictly increasing" in capsys.readouterr().err

    plan = tmp_path / "fast.yaml"
    plan.write_text("ramp: [0.1, 0.5]\nguard_rails: {min_samples_per_arm: 20, min_samples_per_stage: 20}\n")
    assert main(["release", "start", *base, "--candidate", "5", "--serving", "4", "--plan", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "decision 0 on 'policy-a': start" in out and "candidate 5 at 10%" in out
    track = _status(topic, capsys)["tracks"]["policy-a"]
    assert (track["serving_version"], track["candidate_version"], track["candidate_fraction"]) == (4, 5, 0.1)
    assert main(["release", "start", *base, "--candidate", "6"]) == 2
    assert "already has candidate 5" in capsys.readouterr().err

    # The controller, from the state the topic gives: rewards arrive, it decides to ramp and writes that.
    read = read_decisions(kafka, topic, 10.0)
    assert read.unreadable == [] and [r["action"] for r in read.records] == ["start"]
    state = DecisionLog.fold(read.records).states["policy-a"]
    rng = np.random.default_rng(0)
    for i in range(120):
        state = fold_reward(state, RewardObservation(5 if i % 4 == 0 else 4, float(rng.random() < 0.5)))
    decision = decide(state)
    assert decision.action == "ramp"
    ramp, _ = decision_record(state, decision, created_at_us=1)
    publish_decision(kafka, topic, ramp)
    # A second writer that decided on the same old state loses: kept on the topic, changes nothing.
    late, _ = decision_record(state, decide(state), created_at_us=2)
    publish_decision(kafka, topic, {**late, "source": "operator", "event_id": "late-copy"})
    # A record that is not a ReleaseDecision is skipped with the reason.
    producer = Producer(producer_config(kafka))
    producer.produce(topic, key=b"policy-a", value=b"not avro")
    assert producer.flush(30) == 0

    status = _status(topic, capsys)
    track = status["tracks"]["policy-a"]
    assert (track["candidate_fraction"], track["stage"], track["decisions"]) == (0.5, 1, 2)
    last = track["last_decision"]
    assert (last["source"], last["rule"], last["candidate_rewards"]) == ("controller", "stage_samples", 30)
    assert status["stale_decisions"] == 1
    assert main(["release", "status", "--topic", topic]) == 0
    captured = capsys.readouterr()
    assert "candidate 5 at 50% (stage 2 of 2)" in captured.out and "lost a race" in captured.out
    assert "skipped a record" in captured.err and "CorruptRecord" in captured.err

    assert main(["release", "pin", *base, "--label", "eval", "--version", "4"]) == 0
    assert _status(topic, capsys)["tracks"]["policy-a"]["pinned"] == {"eval": 4}
    assert main(["release", "pin", *base, "--label", "nightly", "--clear"]) == 2
    assert "'nightly' is not pinned" in capsys.readouterr().err

    assert main(["release", "rollback", *base, "--reason", "bad answers in review"]) == 0
    assert "rollback" in capsys.readouterr().out
    track = _status(topic, capsys)["tracks"]["policy-a"]
    assert (track["serving_version"], track["candidate_version"], track["pinned"]) == (4, None, {"eval": 4})
    assert track["last_decision"]["reason"] == "bad answers in review"
    assert track["last_decision"]["operator"] == "alice"
    assert main(["release", "promote", *base]) == 2
    assert "has no candidate" in capsys.readouterr().err


def test_a_missing_topic_is_a_cli_error(kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["release", "status", "--topic", "tokentrail.no-such-release-topic", "--timeout", "2"]) == 2
    assert "does not exist" in capsys.readouterr().err
