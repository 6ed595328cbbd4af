"""The feedback join in a real worker on the real broker: rollouts and feedback in, feedback rewards out
equal to what the pure join (processors/feedback/join.py) computes for the same events; late feedback and
unmatched feedback recorded as dead letters with the reason; bad and unmatched feedback dead-lettered and
good feedback after it still used; the audit's fifth check, over what the real sink stored, counts the
unmatched feedback as recorded."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from clickhouse_connect.driver.client import Client

from processors.feedback.config import FeedbackRewardConfig, load_feedback_config
from processors.feedback.join import (
    FeedbackJoin,
    FeedbackReward,
    LateFeedback,
    UnmatchedFeedback,
    reward_record,
    rollout_ref,
)
from processors.stream.topics import partition_for
from reliability.sink_child import topic_map
from schemas.feedback import FeedbackValue, build_feedback
from schemas.ids import call_id
from schemas.topics import FEEDBACK
from sinks.client import chdb_path_in_use, connect
from sinks.ddl import migrate
from sinks.feedback_audit import feedback_accounting
from sinks.feedback_store import load_feedback
from sinks.sink import SinkOptions, run_sink

from .stream_rig import Collected, StreamRig, group_events, interleave

S = 1_000_000
# BINARY counts only up to its rollout's close (so a thumbs-up a second later is late, without moving
# stream time far); every other kind 15 s after. Unmatched after 30 s: longer than a restarted worker's
# calls partition may sit before the watchdog's seek (about 15 s), or feedback whose call index is still
# unread would be declared unmatched (seen in CI with 8 s); closed rollouts kept a minute.
CONFIG = {"name": "feedback-stream-test", "wait_s": {"BINARY": 0, "RATING": 15, "OUTCOME": 15, "TASK_OUTCOME": 15,
                                                     "TEXT": 15},
          "watermark_lag_s": 1, "match_wait_s": 30, "closed_retention_s": 60, "combine": "mean"}


def feedback(target_kind: str, target_id: str, kind: str, at_us: int, value: FeedbackValue, n: int) -> dict:
    return build_feedback(source="test-ui", target_kind=target_kind, target_id=target_id, kind=kind, value=value,
                          event_time_us=at_us, created_at_us=at_us + 5, source_feedback_id=f"fb-{n}")


def feedback_rewards(got: Collected, config_id: str) -> dict[str, dict]:
    return {r["event_id"]: r for r in got.records["Reward"] if r["reward_config_id"] == config_id}


def letters(got: Collected, stage: str) -> list[dict]:
    return [d for d in got.records["DeadLetter"] if d["stage"] == stage]


def stored_by_the_sink(rig: StreamRig, tmp_path: Path) -> Client:
    """A fresh chDB database holding what the real ClickHouse sink reads from the rig's topics (calls, env,
    feedback, every output, dead letters), read once to their ends."""
    in_use = chdb_path_in_use()  # chDB opens one directory per process: share it with other tests
    client = connect(dsn=f"chdb://{in_use or tmp_path / 'chdb'}", database=f"t_feedback_join_{uuid.uuid4().hex[:8]}",
                     create_database=True)
    migrate(client)
    topics, dead_letter_topic = topic_map(rig.topics.prefix)
    topics[rig.topics.feedback] = FEEDBACK.value_schemas
    options = SinkOptions(group_id=f"sink-{rig.topics.prefix}{uuid.uuid4().hex[:6]}", once=True,
                          flush_interval_s=0.5)
    run_sink(client, rig.settings.kafka, options, topic_map=topics, dead_letter_topic=dead_letter_topic,
             log=lambda line: None)
    return client


@dataclass
class Scenario:
    rig: StreamRig
    cfg: FeedbackRewardConfig
    events: list
    good: list[dict]
    bad_value: dict
    after_bad: dict
    close: int
    expected: dict[str, dict]  # the pure join's Reward events
    late_ids: set[str]
    unmatched_ids: set[str]

    def produce(self) -> None:
        """Calls and env events, then feedback: five good ones, garbage, an invalid one, two naming nothing
        known (unmatched), then a good one after them all."""
        rig, topic = self.rig, self.rig.topics.feedback
        rig.produce(self.events)
        for item in self.good[:5]:
            rig.produce_raw(topic, item["target_id"].encode(), rig.codec.encode("Feedback", item))
        rig.produce_raw(topic, b"fa-r3", b"\x00not a feedback record")
        rig.produce_raw(topic, b"fa-r3", rig.codec.encode("Feedback", self.bad_value))
        for item in [*self.good[5:], self.after_bad]:
            rig.produce_raw(topic, item["target_id"].encode(), rig.codec.encode("Feedback", item))
        rig.flush()

    def done(self, got: Collected) -> bool:
        return (set(self.expected) <= set(feedback_rewards(got, self.cfg.id))
                and len(letters(got, "feedback_join")) >= 2 and len(letters(got, "feedback_late")) >= 1
                and len(letters(got, "feedback_router")) >= 2)


def scenario(make_stream_rig: Callable[..., StreamRig], tmp_path: Path) -> Scenario:
    config_path = tmp_path / "feedback_reward.yaml"
    config_path.write_text(yaml.safe_dump(CONFIG))
    cfg = load_feedback_config(config_path)
    rig = make_stream_rig(feedback_join=True, feedback_config=config_path)
    events = group_events("fa", ["4", "5", "4", "no idea"], seed=3)
    for name, record in events:  # rollout fa-r2's calls belong to a session
        if name == "CallRecord" and record["rollout_id"] == "fa-r2":
            record["session_id"] = "sess-fa-r2"
    events = interleave(events, seed=5)
    rollouts = rig.expected(events)["CompletedRollout"]
    assert len(rollouts) == 4
    refs = {r["rollout_id"]: rollout_ref(r, ["sess-fa-r2"] if r["rollout_id"] == "fa-r2" else [])
            for r in rollouts.values()}
    close = max(ref.closed_at_us for ref in refs.values())
    good = [
        feedback("RESPONSE", "chatcmpl-" + call_id("fa-r0", "a1", 0), "RATING", close + 1 * S,
                 FeedbackValue(rating=4.0, rating_min=1.0, rating_max=5.0), 1),
        feedback("CALL", call_id("fa-r0", "a1", 2), "OUTCOME", close + 2 * S,
                 FeedbackValue(outcome="EDITED", edit_distance=0.25), 2),
        feedback("ROLLOUT", "fa-r1", "OUTCOME", close + 1 * S, FeedbackValue(outcome="ACCEPTED"), 3),
        feedback("ROLLOUT", "fa-r1", "BINARY", close + 1 * S, FeedbackValue(binary=False), 4),  # late: wait 0
        feedback("SESSION", "sess-fa-r2", "TASK_OUTCOME", close + 1 * S, FeedbackValue(task_success=True), 5),
        feedback("ROLLOUT", "no-such-rollout", "RATING", close + 1 * S, FeedbackValue(rating=1.0), 6),
        feedback("CALL", "no-such-call", "RATING", close + 1 * S, FeedbackValue(rating=0.5), 7),
    ]
    bad_value = dict(feedback("ROLLOUT", "fa-r3", "RATING", close, FeedbackValue(rating=0.9), 8), rating=7.0)
    after_bad = feedback("ROLLOUT", "fa-r3", "OUTCOME", close + 2 * S, FeedbackValue(outcome="REJECTED"), 9)

    # The pure join over the same events: rewards, and which feedback is late or unmatched.
    join = FeedbackJoin(cfg)
    outputs = [out for ref in refs.values() for out in join.add_rollout(ref)]
    for item in sorted([*good, after_bad], key=lambda f: f["event_time_us"]):
        outputs += join.add_feedback(item)
    outputs += join.tick(close + 1000 * S)
    expected = {r["event_id"]: r for r in (reward_record(o) for o in outputs if isinstance(o, FeedbackReward))}
    late_ids = {o.feedback_id for o in outputs if isinstance(o, LateFeedback)}
    unmatched_ids = {o.feedback_id for o in outputs if isinstance(o, UnmatchedFeedback)}
    assert len(expected) == 4 and late_ids == {good[3]["event_id"]}
    assert unmatched_ids == {good[5]["event_id"], good[6]["event_id"]}
    assert {r["rollout_id"]: r["filtered"] for r in expected.values()} == {
        "fa-r0": False, "fa-r1": False, "fa-r2": False, "fa-r3": False}

    return Scenario(rig, cfg, events, good, bad_value, after_bad, close, expected, late_ids, unmatched_ids)


def test_worker_joins_feedback_to_rollouts_as_the_pure_join_does(make_stream_rig: Callable[..., StreamRig],
                                                                tmp_path: Path) -> None:
    sc = scenario(make_stream_rig, tmp_path)
    rig, cfg, good, expected, close = sc.rig, sc.cfg, sc.good, sc.expected, sc.close
    unmatched_ids, after_bad = sc.unmatched_ids, sc.after_bad
    sc.produce()
    feedback_topic = rig.topics.feedback
    rig.start_worker()
    got = rig.collect(sc.done, timeout_s=90)
    assert feedback_rewards(got, cfg.id) == expected  # the same events, ids and values as the pure join's
    assert {d["reason"].split(":")[0] for d in letters(got, "feedback_join")} == {
        f"feedback {fid}" for fid in unmatched_ids}
    late = letters(got, "feedback_late")
    assert [(d["error_type"], d["source_topic"]) for d in late] == [("LateFeedback", feedback_topic)]
    assert good[3]["event_id"] in late[0]["reason"] and "outside_window" in late[0]["reason"]
    # The feedback itself, kept (read back with the contract's defaults for the fields it did not set).
    assert rig.codec.decode(late[0]["value"], expect="Feedback")[1] == {"subject": None, "sealed": None, **good[3]}
    router_letters = letters(got, "feedback_router")
    assert sorted(d["error_type"] for d in router_letters) == ["CorruptRecord", "InvalidEvent"]
    assert any("rating 7.0 is outside its scale" in d["reason"] for d in router_letters)
    # Good feedback after the bad and the unmatched feedback, on the same input partition, is still used.
    assert len({partition_for(f["target_id"].encode(), rig.settings.kafka.partitions)
                for f in (*good[5:], after_bad)}) == 1
    assert after_bad["event_id"] in {fid for r in expected.values() for fid in r["score_ids"]}

    # Feedback for a rollout whose window has closed: recorded as late (after_close), the reward stays.
    # Feedback already used, delivered again (a retried publish): recognised as used, not recorded late.
    too_late = feedback("ROLLOUT", "fa-r0", "RATING", close + 3 * S, FeedbackValue(rating=0.0), 10)
    for item in (good[2], good[0], too_late):
        rig.produce_raw(feedback_topic, item["target_id"].encode(), rig.codec.encode("Feedback", item))
    rig.flush()
    got = rig.collect(lambda c: len(letters(c, "feedback_late")) >= 2, timeout_s=30)
    got = rig.settle()
    after_close = [d for d in letters(got, "feedback_late") if too_late["event_id"] in d["reason"]]
    assert len(after_close) == 1 and "after_close" in after_close[0]["reason"]
    assert len(letters(got, "feedback_late")) == 2  # the outside_window one and this one; none for the repeats
    assert feedback_rewards(got, cfg.id) == expected
    assert rig.stop_all() == [0]

    # The audit's fifth check over what the real sink stored: the unmatched feedback is counted as recorded
    # (by its dead letter), neither silently dropped nor still pending; without those letters it is pending.
    client = stored_by_the_sink(rig, tmp_path)
    try:
        stored = {f["event_id"] for f in load_feedback(client)}
        assert unmatched_ids <= stored and after_bad["event_id"] in stored
        audit = feedback_accounting(client, cfg)
        assert audit.passed and audit.notes == [], (audit.failures, audit.notes)
        assert audit.checked == len(expected) + len(stored)
        client.command("ALTER TABLE dead_letters DELETE WHERE stage = 'feedback_join' SETTINGS mutations_sync = 2")
        without = feedback_accounting(client, cfg)
        assert without.passed and without.notes[0].startswith(f"{len(unmatched_ids)} feedback event(s) still pending")
    finally:
        client.command(f"DROP DATABASE IF EXISTS {client.database}")


def test_a_worker_killed_mid_window_is_replaced_and_the_join_resumes_from_its_tables(
        make_stream_rig: Callable[..., StreamRig], tmp_path: Path) -> None:
    sc = scenario(make_stream_rig, tmp_path)
    rig = sc.rig
    sc.produce()
    worker = rig.start_worker()
    # Feedback read and the rollouts assembled, their feedback windows (15 s) still open: kill -9.
    rig.collect(lambda c: len(letters(c, "feedback_router")) >= 2 and len(c.ids("CompletedRollout")) >= 4,
                timeout_s=60)
    rig.kill(worker)
    rewards_at_kill = len(feedback_rewards(rig.collected, sc.cfg.id))
    rig.start_worker()
    got = rig.collect(sc.done, timeout_s=90)
    rewards = [r for r in got.records["Reward"] if r["reward_config_id"] == sc.cfg.id]
    assert {r["event_id"]: r for r in rewards} == sc.expected
    assert all(r == sc.expected[r["event_id"]] for r in rewards)  # any re-emitted copy is identical
    assert {d["reason"].split(":")[0] for d in letters(got, "feedback_join")} == {
        f"feedback {fid}" for fid in sc.unmatched_ids}
    print(f"feedback rewards out before the kill: {rewards_at_kill} of {len(sc.expected)}")
