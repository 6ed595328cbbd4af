"""A rollback tells the trainer: before its next step it loads the last good version from the policy store,
clears the optimizer, records the resume as an event (TrainerStep v3), publishes those weights as its next
version with the rollback in the metadata, and does it once (a restarted trainer reads what it accounted for
from its policy). Decisions come from the real release core; the follower and the whole trainer are tested on
the real broker."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from models.policy_store import PolicyStore
from processors.release.controller import ReleaseState, initial_state, manual_decision, start_decision
from processors.release.events import decision_record
from processors.release.plan import load_plan
from processors.stream.release_controller import publish_decision
from schemas.codec import get_codec
from schemas.kafka import config as kafka_config
from schemas.kafka.release_follower import ReleaseFollower
from testkit.samples import random_sequence, sample_record
from tokentrail.settings import Settings
from trainer_consumer.batching import batches_from_samples
from trainer_consumer.learner import Learner, LearnerConfig
from trainer_consumer.policy import StorePublisher
from trainer_consumer.rollback_resume import RELEASE_SEQUENCE, RollbackResumer, resume_due
from trainer_consumer.trainer import TrainerState, TrainingLoop, TrainOptions, run_training

from .helpers import VOCAB, decode_round_trip, make_tiny_model
from .test_loop import ListSink, ListSource

PLAN = load_plan({"ramp": [0.5]})
MODEL = "track"


class Track:
    """Decisions on one track, made by the release core as the CLI and the controller make them."""

    def __init__(self, serving: int) -> None:
        self.state: ReleaseState = initial_state(MODEL, PLAN, serving_version=serving)
        self.applied: list[dict[str, Any]] = []

    def decide(self, make: Callable[[ReleaseState], Any]) -> dict[str, Any]:
        record, self.state = decision_record(self.state, make(self.state), created_at_us=time.time_ns() // 1000)
        self.applied.append(record)
        return record


def test_resume_due_picks_the_newest_unhandled_rollback_of_a_version_the_trainer_descends_from() -> None:
    track = Track(serving=1)
    track.decide(lambda s: start_decision(s, 2, "test", plan=PLAN))
    rollback = track.decide(lambda s: manual_decision(s, "rollback", "test"))
    assert resume_due(track.applied, current_version=3, handled_sequence=-1).resume_from == 1
    assert resume_due(track.applied, current_version=3, handled_sequence=-1).rolled_back == 2
    assert resume_due(track.applied, current_version=3, handled_sequence=rollback["sequence"]) is None  # done
    assert resume_due(track.applied, current_version=1, handled_sequence=-1) is None  # not its line
    track.decide(lambda s: start_decision(s, 5, "test", plan=PLAN))
    track.decide(lambda s: manual_decision(s, "promote", "test"))
    assert resume_due(track.applied, current_version=6, handled_sequence=rollback["sequence"]) is None
    assert resume_due([], current_version=6, handled_sequence=-1) is None


def _batches(count: int, version: int) -> list[Any]:
    rng = np.random.default_rng(0)
    samples = [decode_round_trip(sample_record([random_sequence(rng, VOCAB, 5, 3, f"r{i}")], policy_version=version))
               for i in range(2 * count)]
    return list(batches_from_samples(zip(samples, range(2 * count), strict=True), batch_size=2,
                                     current_version=version))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rollback_resumes_from_the_last_good_version_once(tmp_path) -> None:
    store = PolicyStore(tmp_path / "policies")
    model = make_tiny_model()
    store.publish(1, model.state_dict(), {"run_id": "run-r", "step": 0})
    good = store.load_state_dict(1)
    track = Track(serving=1)
    lines: list[str] = []
    resumer = RollbackResumer(lambda: track.applied, store.load_state_dict, progress=lines.append)
    learner = Learner(model, LearnerConfig(learning_rate=1e-2))
    source, sink = ListSource(_batches(4, version=1)), ListSink()
    loop = TrainingLoop(learner, source, sink, StorePublisher(store), run_id="run-r", steps_per_version=1,
                        state=TrainerState(step=0, version=1), resumer=resumer)

    summary = loop.run(max_steps=2)  # v2 and v3: v2 becomes the candidate
    assert summary.versions_published == [2, 3] and not _same(store.load_state_dict(3), good)
    assert learner.optimizer.state  # AdamW moments gathered on the line that will be abandoned
    track.decide(lambda s: start_decision(s, 2, "test", plan=PLAN))
    rollback = track.decide(lambda s: manual_decision(s, "rollback", "test", "worse"))

    summary = loop.run(max_steps=1)
    # Before the step: v1's weights published as v4 with the rollback recorded; then the step publishes v5.
    assert summary.versions_published == [4, 5]
    assert _same(store.load_state_dict(4), good)
    meta = store.info(4).metadata
    assert (meta["resumed_from"], meta["rolled_back_candidate"], meta["rollback_decision"]) == (
        1, 2, rollback["event_id"])
    assert meta[RELEASE_SEQUENCE] == rollback["sequence"] == store.info(5).metadata[RELEASE_SEQUENCE]
    assert resumer.resumes == [{"version": 4, "resumed_from": 1, "rolled_back_candidate": 2,
                                "rollback_decision": rollback["event_id"]}]
    assert "resumed from v1, published as v4" in lines[-1]
    # The resume is an event of its own, emitted before the step after it: a TrainerStep with no samples.
    resume_event, step_event = sink.records[-2:]
    assert (resume_event["policy_version_before"], resume_event["policy_version_after"]) == (3, 4)
    assert (resume_event["resumed_from_version"], resume_event["rolled_back_version"]) == (1, 2)
    assert resume_event["resume_decision_id"] == rollback["event_id"]
    assert resume_event["resume_release_id"] == rollback["release_id"] != ""
    assert resume_event["resume_reason"] == "operator rollback (manual): worse"
    assert resume_event["sample_ids"] == [] and resume_event["step"] == 2 and resume_event["tokens"] == 0
    assert step_event["resumed_from_version"] == -1 and step_event["policy_version_before"] == 4
    # The step after the resume trained from v1's weights with fresh moments: v5 is one step away from v1.
    assert not _same(store.load_state_dict(5), good)

    summary = loop.run(max_steps=1)  # the same rollback is not applied twice
    assert summary.versions_published == [6] and len(resumer.resumes) == 1
    # A restarted trainer reads what it accounted for from its latest policy: nothing is due.
    restarted = RollbackResumer(lambda: track.applied, store.load_state_dict,
                                handled_sequence=store.info(6).metadata[RELEASE_SEQUENCE])
    assert restarted.check(model, learner.optimizer, 6, lambda _resume, _meta: 7) is None


def test_the_follower_gives_the_trainer_its_tracks_applied_decisions(tokentrail_settings: Settings,
                                                                    kafka_bootstrap: str,
                                                                    new_topic: Callable[..., str]) -> None:
    kafka, topic = tokentrail_settings.kafka, new_topic(partitions=1)
    track, other = Track(serving=1), Track(serving=7)
    other.state = initial_state("other-track", PLAN, serving_version=7)
    start = track.decide(lambda s: start_decision(s, 2, "test", plan=PLAN))
    publish_decision(kafka, topic, start)
    publish_decision(kafka, topic, dict(start, event_id="a-late-copy"))  # stale: changes nothing
    publish_decision(kafka, topic, other.decide(lambda s: start_decision(s, 8, "test", plan=PLAN)))
    follower = ReleaseFollower(kafka, MODEL, topic, poll_s=0.05, reader="trainer").start()
    try:
        assert follower.caught_up.wait(60)
        assert [r["event_id"] for r in follower.applied()] == [start["event_id"]]
        rollback = track.decide(lambda s: manual_decision(s, "rollback", "test"))
        publish_decision(kafka, topic, rollback)
        deadline = time.monotonic() + 30
        while len(follower.applied()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [r["action"] for r in follower.applied()] == ["start", "rollback"]
        due = resume_due(follower.applied(), current_version=3, handled_sequence=-1)
        assert due is not None and (due.resume_from, due.rolled_back) == (1, 2)
    finally:
        follower.close()


def test_the_trainer_publishes_its_resume_as_an_event_on_kafka(tokentrail_settings: Settings, kafka_bootstrap: str,
                                                               new_topic: Callable[..., str], tmp_path) -> None:
    """The real trainer (``run_training``) with the real follower on the broker: v2 and v3 trained, v2 rolled
    back while the trainer is down, and the restarted trainer's first act is the resume: its event on the steps
    topic (read back through the codec), then the weights as v4, then a step from them."""
    settings, codec = tokentrail_settings, get_codec()
    samples_topic, steps_topic, dead_topic, decisions_topic = (new_topic(partitions=1) for _ in range(4))
    model_dir = tmp_path / "model"
    make_tiny_model().save_pretrained(model_dir)
    store = PolicyStore(tmp_path / "policies")
    store.publish(1, make_tiny_model().state_dict(), {"run_id": "base", "step": 0})
    good = store.load_state_dict(1)
    rng = np.random.default_rng(1)

    def produce_samples(count: int, version: int) -> None:
        producer = Producer(kafka_config.producer_config(settings.kafka))
        for i in range(count):
            record = sample_record([random_sequence(rng, VOCAB, 5, 3, f"r{version}-{i}")], policy_version=version)
            producer.produce(samples_topic, value=codec.encode("Sample", record))
        assert producer.flush(30) == 0

    options = TrainOptions(max_steps=2, batch_size=2, idle_timeout_s=2.0, group_id=f"resume-{uuid.uuid4().hex[:8]}",
                           run_id="run-resume", steps_per_version=1, model_dir=model_dir, checkpoint_dir=store.root,
                           samples_topic=samples_topic, steps_topic=steps_topic, dead_letter_topic=dead_topic,
                           release_model=MODEL, release_topic=decisions_topic)
    produce_samples(4, version=1)
    assert run_training(settings, options).versions_published == [2, 3]

    track = Track(serving=1)
    publish_decision(settings.kafka, decisions_topic, track.decide(lambda s: start_decision(s, 2, "ops", plan=PLAN)))
    rollback = track.decide(lambda s: manual_decision(s, "rollback", "ops", "v2 answers worse"))
    publish_decision(settings.kafka, decisions_topic, rollback)
    produce_samples(2, version=3)
    lines: list[str] = []
    again = run_training(settings, dataclasses.replace(options, max_steps=1), progress=lines.append)

    assert again.versions_published == [4, 5] and _same(store.load_state_dict(4), good)
    assert any("resumed from v1, published as v4" in line for line in lines)
    events = _read_topic(settings, steps_topic, expect=4)
    assert [(e["step"], e["policy_version_before"], e["policy_version_after"], len(e["sample_ids"]))
            for e in events] == [(1, 1, 2, 2), (2, 2, 3, 2), (2, 3, 4, 0), (3, 4, 5, 2)]
    resume = events[2]
    assert (resume["resumed_from_version"], resume["rolled_back_version"]) == (1, 2)
    assert (resume["resume_decision_id"], resume["resume_release_id"]) == (rollback["event_id"],
                                                                            rollback["release_id"])
    assert resume["resume_reason"] == "operator rollback (manual): v2 answers worse"
    assert [e["resumed_from_version"] for e in events if e is not resume] == [-1, -1, -1]


def _read_topic(settings: Settings, topic: str, expect: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    consumer = Consumer(kafka_config.consumer_config(settings.kafka, f"test-read-{uuid.uuid4().hex}"))
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < expect and time.monotonic() < deadline:
            out += [get_codec().decode(m.value(), topic=topic)[1] for m in consumer.consume(100, timeout=1.0)
                    if m.error() is None]
    finally:
        consumer.close()
    return out
