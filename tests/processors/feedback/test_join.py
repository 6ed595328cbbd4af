"""The feedback join by example: each combination rule, the missing rule, supersede, late and unmatched
feedback, the configuration file, and the records it emits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from processors.errors import ConfigError
from processors.feedback.combine import combine, feedback_value
from processors.feedback.config import FeedbackRewardConfig, load_feedback_config
from processors.feedback.join import (
    FeedbackJoin,
    FeedbackReward,
    LateFeedback,
    UnmatchedFeedback,
    reward_record,
    rollout_ref,
    unmatched_dead_letter,
)
from processors.feedback.replay import event_time_rewards
from schemas.builders import make_call
from schemas.codec import get_codec
from schemas.feedback import FeedbackValue

from .scenarios import T0, S, feedback, rollout

REPO = Path(__file__).resolve().parents[3]
WAITS = {"BINARY": 10.0, "RATING": 10.0, "OUTCOME": 30.0, "TASK_OUTCOME": 60.0, "TEXT": 10.0}


def config(**changes: object) -> FeedbackRewardConfig:
    return FeedbackRewardConfig(**{"wait_s": WAITS, "watermark_lag_s": 0.0, "match_wait_s": 100.0, **changes})


def rewards_of(outputs: list) -> list[FeedbackReward]:
    return [o for o in outputs if isinstance(o, FeedbackReward)]


def close_all(join: FeedbackJoin) -> list:
    return join.tick(T0 + 10_000 * S)


def one_reward(cfg: FeedbackRewardConfig, *items: dict) -> FeedbackReward:
    """The reward of rollout r0 (closed at 0 s) given this feedback, all arriving in time."""
    join = FeedbackJoin(cfg)
    out = join.add_rollout(rollout(0, 0, calls=2, session="s0"))
    for item in items:
        out += join.add_feedback(item)
    [reward] = rewards_of(out + close_all(join))
    return reward


def test_each_kind_has_its_value() -> None:
    cfg = config()
    assert feedback_value(feedback("ROLLOUT", "r0", "BINARY", 1, value=FeedbackValue(binary=True)), cfg) == 1.0
    assert feedback_value(feedback("ROLLOUT", "r0", "BINARY", 1, value=FeedbackValue(binary=False)), cfg) == 0.0
    rating = FeedbackValue(rating=4.0, rating_min=1.0, rating_max=5.0)
    assert feedback_value(feedback("ROLLOUT", "r0", "RATING", 1, value=rating), cfg) == 0.75
    edited = FeedbackValue(outcome="EDITED", edit_distance=0.25)
    assert feedback_value(feedback("ROLLOUT", "r0", "OUTCOME", 1, value=edited), cfg) == 0.75
    fixed = config(values={"edited_by_distance": False, "edited": 0.4})
    assert feedback_value(feedback("ROLLOUT", "r0", "OUTCOME", 1, value=edited), fixed) == 0.4
    failed = FeedbackValue(task_success=False, details={"ci": "red"})
    assert feedback_value(feedback("ROLLOUT", "r0", "TASK_OUTCOME", 1, value=failed), cfg) == 0.0
    assert feedback_value(feedback("ROLLOUT", "r0", "TEXT", 1), cfg) is None


def thumbs(at: float, up: bool, n: int) -> dict:
    return feedback("RESPONSE", "chatcmpl-c0-1", "BINARY", at, n=n, value=FeedbackValue(binary=up))


def test_latest_takes_the_last_by_event_time_not_by_arrival() -> None:
    early_up, late_down = thumbs(1, True, 1), thumbs(2, False, 2)
    reward = one_reward(config(combine="latest"), late_down, early_up)  # arrival order reversed
    assert reward.reward == 0.0 and reward.used_ids == (late_down["event_id"],)
    assert reward.admitted_ids == (early_up["event_id"], late_down["event_id"])


def test_mean_averages_every_valued_feedback_and_skips_text() -> None:
    items = [thumbs(1, True, 1), thumbs(2, True, 2), thumbs(3, False, 3), feedback("SESSION", "s0", "TEXT", 4)]
    reward = one_reward(config(combine="mean"), *items)
    assert reward.reward == pytest.approx(2 / 3)
    assert len(reward.used_ids) == 3 and len(reward.admitted_ids) == 4


def test_first_terminal_takes_the_first_outcome_and_ignores_thumbs() -> None:
    accepted = feedback("CALL", "c0-0", "OUTCOME", 3, n=1, value=FeedbackValue(outcome="ACCEPTED"))
    ci_failed = feedback("ROLLOUT", "r0", "TASK_OUTCOME", 5, n=2, value=FeedbackValue(task_success=False))
    reward = one_reward(config(combine="first_terminal"), thumbs(1, False, 0), ci_failed, accepted)
    assert reward.reward == 1.0 and reward.used_ids == (accepted["event_id"],)


def test_weighted_combines_kind_means_by_weight() -> None:
    cfg = config(combine="weighted", weights={"BINARY": 1.0, "TASK_OUTCOME": 3.0})
    ci_passed = feedback("ROLLOUT", "r0", "TASK_OUTCOME", 5, n=2, value=FeedbackValue(task_success=True))
    reward = one_reward(cfg, thumbs(1, False, 0), thumbs(2, True, 1), ci_passed, feedback("ROLLOUT", "r0", "RATING", 3))
    assert reward.reward == pytest.approx((1 * 0.5 + 3 * 1.0) / 4)  # RATING has no weight: not used
    assert len(reward.used_ids) == 3


def test_no_feedback_is_excluded_or_gets_the_default() -> None:
    excluded = one_reward(config(missing="exclude"), feedback("SESSION", "s0", "TEXT", 1))
    assert excluded.excluded and not excluded.defaulted
    record = reward_record(excluded)
    assert record["filtered"] and record["filter_reason"] == "no feedback"
    defaulted = one_reward(config(missing="default", default=0.25))
    assert defaulted.reward == 0.25 and defaulted.defaulted and defaulted.admitted_ids == ()


def test_a_revision_supersedes_only_through_the_config_rule() -> None:
    first = thumbs(1, False, 1)
    revision = feedback("RESPONSE", "chatcmpl-c0-1", "BINARY", 2, n=2, value=FeedbackValue(binary=True),
                        supersedes=first["event_id"])
    replaced = one_reward(config(combine="mean", supersede="replace"), revision, first)
    assert replaced.reward == 1.0 and replaced.superseded_ids == (first["event_id"],)
    kept = one_reward(config(combine="mean", supersede="keep"), revision, first)
    assert kept.reward == 0.5 and kept.superseded_ids == ()
    assert first["event_id"] in kept.admitted_ids and first["event_id"] in replaced.admitted_ids  # never erased


def test_feedback_after_the_window_closes_is_late_counted_and_not_used() -> None:
    join = FeedbackJoin(config(combine="mean"))
    in_time = thumbs(5, True, 1)
    out = join.add_rollout(rollout(0, 0)) + join.add_feedback(in_time)
    out += join.tick(T0 + 61 * S)  # past the longest wait (60 s): the window closes
    [reward] = rewards_of(out)
    assert reward.used_ids == (in_time["event_id"],) and reward.reward == 1.0
    too_late = thumbs(6, False, 2)  # its event time is in the window, but it arrives after the close
    assert join.add_feedback(too_late) == [LateFeedback(too_late["event_id"], "ev-r0", "after_close")]
    outside = thumbs(11, False, 3)  # BINARY waits 10 s
    join2 = FeedbackJoin(config())
    join2.add_rollout(rollout(0, 0))
    assert join2.add_feedback(outside) == [LateFeedback(outside["event_id"], "ev-r0", "outside_window")]
    [kept_out] = rewards_of(close_all(join2))
    assert kept_out.excluded


def test_feedback_before_its_rollout_waits_for_it() -> None:
    join = FeedbackJoin(config())
    early = feedback("CALL", "c0-1", "OUTCOME", -50, value=FeedbackValue(outcome="ACCEPTED"))  # mid-session
    assert join.add_feedback(early) == []
    out = join.add_rollout(rollout(0, 0)) + close_all(join)
    [reward] = rewards_of(out)
    assert reward.reward == 1.0 and not [o for o in out if isinstance(o, UnmatchedFeedback)]


def test_feedback_naming_nothing_known_is_unmatched_with_the_reason() -> None:
    join = FeedbackJoin(config(match_wait_s=20.0))
    join.add_rollout(rollout(0, 0))
    stray = feedback("SESSION", "s-unknown", "BINARY", 1, value=FeedbackValue(binary=True))
    assert join.add_feedback(stray) == []  # it may still appear
    out = join.tick(T0 + 22 * S)
    [unmatched] = [o for o in out if isinstance(o, UnmatchedFeedback)]
    assert unmatched.feedback_id == stray["event_id"] and "s-unknown" in unmatched.reason
    foreign = dict(stray, target_kind="RESPONSE", target_id="gen-123", call_id=None, event_id="foreign")
    [now] = join.add_feedback(foreign)
    assert isinstance(now, UnmatchedFeedback) and "names no call" in now.reason
    value = get_codec().encode("Feedback", stray)
    letter = unmatched_dead_letter(unmatched, source_topic="tokentrail.feedback", partition=0, offset=7,
                                   key=b"s-unknown", value=value, created_at_us=T0)
    assert letter["error_type"] == "UnmatchedFeedback" and "s-unknown" in letter["reason"]
    assert get_codec().decode(get_codec().encode("DeadLetter", letter))[1] == letter


def test_a_closed_rollout_is_forgotten_after_its_retention() -> None:
    join = FeedbackJoin(config(closed_retention_s=5.0, match_wait_s=1.0))
    join.add_rollout(rollout(0, 0))
    join.tick(T0 + 70 * S)  # closed at 60 s, forgotten after 65 s
    very_late = thumbs(71, True, 1)
    join.add_feedback(very_late)
    out = join.tick(T0 + 80 * S)
    assert [o.feedback_id for o in out if isinstance(o, UnmatchedFeedback)] == [very_late["event_id"]]
    assert not join.closed and not join.rollouts_by_target and not join.pending  # the state stays bounded


def test_re_delivered_inputs_change_nothing() -> None:
    join = FeedbackJoin(config(combine="mean"))
    up = thumbs(1, True, 1)
    join.add_rollout(rollout(0, 0))
    join.add_feedback(up)
    join.add_feedback(up)
    join.add_rollout(rollout(0, 0))
    [reward] = rewards_of(close_all(join))
    assert reward.admitted_ids == (up["event_id"],)


def test_the_reward_record_is_a_valid_reward_event_with_a_stable_id() -> None:
    reward = one_reward(config(), thumbs(1, True, 1))
    record = reward_record(reward)
    assert get_codec().decode(get_codec().encode("Reward", record))[1] == record
    assert record["score_ids"] == list(reward.used_ids) and record["reward_config_id"] == config().id
    assert json.loads(record["components_json"])["source"] == "feedback"
    assert reward_record(one_reward(config(), thumbs(1, True, 1)))["event_id"] == record["event_id"]


def test_rollout_ref_from_a_completed_rollout() -> None:
    calls = [make_call("r9", "a1", i, [1, 2], [3]) for i in range(2)]
    completed = {"event_id": "ev9", "rollout_id": "r9", "attempt_id": "a1", "group_id": None,
                 "call_ids": [c["call_id"] for c in calls], "created_at_us": T0}
    ref = rollout_ref(completed, session_ids=["s1", "s1"])
    assert ref.target_keys() == [("rollout", "r9"), *(("call", c["call_id"]) for c in calls), ("session", "s1")]


def test_the_deployed_config_loads_and_bad_ones_are_refused() -> None:
    cfg = load_feedback_config(REPO / "deploy" / "config" / "feedback_reward.yaml")
    assert cfg.combine == "latest" and cfg.window_us == 86_400 * S and len(cfg.id) == 16
    assert load_feedback_config(cfg.model_dump(mode="json")).id == cfg.id  # the id is its content
    with pytest.raises(ConfigError, match="wait_s needs every kind"):
        load_feedback_config({"wait_s": {"BINARY": 1}})
    with pytest.raises(ConfigError, match="weighted needs weights"):
        load_feedback_config({"combine": "weighted"})
    with pytest.raises(ConfigError, match="combine"):
        load_feedback_config({"combine": "median"})


def test_combine_is_independent_of_input_order() -> None:
    items = [thumbs(t, t % 2 == 0, t) for t in range(6)]
    for rule in ("latest", "mean", "first_terminal", "weighted"):
        cfg = config(combine=rule, weights={"BINARY": 1.0})
        assert combine(items, cfg) == combine(list(reversed(items)), cfg)


def test_replay_admits_the_late_feedback_and_differs_exactly_there() -> None:
    cfg = config(combine="mean")
    refs = [rollout(0, 0), rollout(1, 0)]
    up0, up1, late_down = thumbs(1, True, 1), feedback("CALL", "c1-0", "BINARY", 1, n=2), thumbs(2, False, 3)
    join = FeedbackJoin(cfg)
    out = join.add_rollout(refs[0]) + join.add_rollout(refs[1]) + join.add_feedback(up0) + join.add_feedback(up1)
    out += join.tick(T0 + 100 * S) + join.add_feedback(late_down)  # in its window by event time, arrived late
    live = {r.rollout_event_id: r for r in rewards_of(out)}
    assert LateFeedback(late_down["event_id"], "ev-r0", "after_close") in out
    replayed = {r.rollout_event_id: r for r in event_time_rewards(refs, [up0, up1, late_down], cfg)}
    assert replayed["ev-r1"] == live["ev-r1"]  # no late feedback there: the same reward
    assert (live["ev-r0"].reward, replayed["ev-r0"].reward) == (1.0, 0.5)
    assert set(replayed["ev-r0"].used_ids) - set(live["ev-r0"].used_ids) == {late_down["event_id"]}


def test_feedback_waiting_for_its_rollout_can_be_withdrawn_and_is_then_never_reported() -> None:
    """The stream sheds feedback that waits (newest first) to make room for the rollout's own attempt in a
    bounded state (issue 29): withdrawn feedback is in no reward and never reported late or unmatched."""
    join = FeedbackJoin(config())
    early = feedback("ROLLOUT", "r0", "RATING", 1, n=1, value=FeedbackValue(rating=0.2))
    newest = feedback("ROLLOUT", "r0", "RATING", 2, n=2, value=FeedbackValue(rating=0.9))
    assert join.add_feedback(early) + join.add_feedback(newest) == []
    assert join.waiting_unmatched() == [early["event_id"], newest["event_id"]]
    assert join.withdraw(newest["event_id"]) == newest
    assert join.add_rollout(rollout(0, 0)) == []
    with pytest.raises(AssertionError, match="met a rollout"):  # admitted to a window: it is not shed
        join.withdraw(early["event_id"])
    [reward] = close_all(join)  # the reward alone: nothing late or unmatched names the withdrawn feedback
    assert isinstance(reward, FeedbackReward)
    assert reward.admitted_ids == (early["event_id"],) and reward.reward == 0.2
    assert newest["event_id"] not in join.pending
