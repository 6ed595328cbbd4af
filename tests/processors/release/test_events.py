"""ReleaseDecision records: built from decisions, encoded by the codec, folded back into the same state."""

from __future__ import annotations

import json

import numpy as np
import pytest

from processors.errors import InvalidEvent
from processors.release.arms import CallObservation, RewardObservation
from processors.release.controller import (
    ReleaseState,
    decide,
    fold_call,
    fold_reward,
    initial_state,
    manual_decision,
    pin_decision,
    start_decision,
)
from processors.release.events import RELEASE_DECISION, DecisionLog, Record, decision_record
from processors.release.plan import load_plan
from schemas.codec import get_codec

PLAN = load_plan({"ramp": [0.1, 0.5], "guard_rails": {"min_samples_per_arm": 20, "min_samples_per_stage": 20,
                                                      "min_calls_per_arm": 20}})


def _round_trip(record: Record) -> Record:
    codec = get_codec()
    name, decoded = codec.decode(codec.encode(RELEASE_DECISION, record), expect=RELEASE_DECISION)
    assert name == RELEASE_DECISION
    return decoded


def _history() -> tuple[list[Record], ReleaseState]:
    """start -> pin -> (rewards) -> ramp by the controller -> promote by an operator."""
    rng = np.random.default_rng(5)
    state = initial_state("policy", PLAN, serving_version=3)
    records = []
    for make in (lambda s: start_decision(s, 4, "ops", plan=PLAN), lambda s: pin_decision(s, "eval", 3, "ops")):
        record, state = decision_record(state, make(state), created_at_us=1_000 + len(records))
        records.append(record)
    for i in range(200):
        version = 4 if i % 4 == 0 else 3
        state = fold_reward(state, RewardObservation(version, float(rng.random() < 0.5)))
        state = fold_call(state, CallObservation(version, ok=True, latency_ms=float(rng.exponential(80.0))))
    decision = decide(state)
    assert decision.action == "ramp"
    record, state = decision_record(state, decision, created_at_us=2_000)
    records.append(record)
    record, state = decision_record(state, manual_decision(state, "promote", "ops"), created_at_us=3_000)
    records.append(record)
    return records, state


def test_decisions_encode_and_fold_back_to_the_state() -> None:
    records, final = _history()
    decoded = [_round_trip(r) for r in records]
    assert decoded == records
    assert [r["action"] for r in decoded] == ["start", "pin", "ramp", "promote"]
    assert [r["sequence"] for r in decoded] == [0, 1, 2, 3]
    log = DecisionLog.fold(decoded)
    assert not log.stale
    state = log.states["policy"]
    assert (state.serving_version, state.candidate_version, state.sequence) == (4, None, 4)
    assert state.pinned == final.pinned == {"eval": 3}
    ramp = decoded[2]
    assert (ramp["source"], ramp["rule"], ramp["stage"], ramp["candidate_fraction"]) == ("controller",
                                                                                       "stage_samples", 1, 0.5)
    assert ramp["serving_rewards"] + ramp["candidate_rewards"] == 200
    assert ramp["interval_low"] is not None and ramp["interval_low"] < ramp["interval_high"]
    assert json.loads(ramp["plan_json"])["ramp"] == [0.1, 0.5] and ramp["plan_id"] == PLAN.plan_id
    promote = decoded[3]
    assert (promote["serving_version"], promote["candidate_version"], promote["candidate_fraction"]) == (3, 4, 1.0)


def test_a_folded_ramp_keeps_the_totals_the_controller_decided_on() -> None:
    records, _ = _history()
    after_ramp = DecisionLog.fold(records[:3]).states["policy"]
    assert after_ramp.stage == 1 and after_ramp.candidate_version == 4
    assert after_ramp.candidate.rewards == records[2]["candidate_rewards"] == after_ramp.stage_start_rewards
    assert after_ramp.candidate.reward_mean == pytest.approx(records[2]["candidate_reward_mean"])
    assert after_ramp.serving.reward_variance == pytest.approx(records[2]["serving_reward_var"])


def test_event_ids_are_deterministic_and_a_decision_that_lost_a_race_changes_nothing() -> None:
    first, _ = _history()
    again, _ = _history()
    assert [r["event_id"] for r in first] == [r["event_id"] for r in again]
    assert len({r["event_id"] for r in first}) == 4
    # An operator's rollback taken on the state before the controller's ramp reaches the topic after it.
    before_ramp = DecisionLog.fold(first[:2]).states["policy"]
    late, _ = decision_record(before_ramp, manual_decision(before_ramp, "rollback", "ops"), created_at_us=2_500)
    log = DecisionLog.fold([*first[:3], late, first[3]])
    assert log.stale == [late]
    assert log.states["policy"].serving_version == 4


def test_a_hold_is_not_an_event_and_a_malformed_record_is_set_aside_with_its_reason() -> None:
    state = initial_state("policy", PLAN, serving_version=3)
    with pytest.raises(InvalidEvent, match="hold"):
        decision_record(state, decide(state), created_at_us=1)
    record, _ = decision_record(state, start_decision(state, 4, "ops"), created_at_us=1)
    log = DecisionLog.fold([{**record, "plan_json": "{not json"}, {**record, "action": "explode"}, record])
    assert [reason for _, reason in log.rejected] == [
        f"ReleaseDecision {record['event_id']!r} is malformed: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)",
        f"ReleaseDecision {record['event_id']!r} has unknown action 'explode'; known: start, ramp, promote, "
        "rollback, pin",
    ]
    assert log.applied == [record] and log.states["policy"].candidate_version == 4  # folding went on
