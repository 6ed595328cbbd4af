"""The controller's state and decisions: folding observations, each rule, applying, operators' decisions."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from processors.release.arms import ArmStats, CallObservation, RewardObservation
from processors.release.controller import (
    ReleaseError,
    ReleaseState,
    apply,
    decide,
    fold_call,
    fold_reward,
    initial_state,
    manual_decision,
    pin_decision,
    start_decision,
)
from processors.release.plan import load_plan

PLAN = load_plan({"ramp": [0.1, 0.5], "pinned": {"eval": 2},
                  "guard_rails": {"min_samples_per_arm": 50, "min_samples_per_stage": 50, "min_calls_per_arm": 50}})


def _started() -> ReleaseState:
    state = initial_state("policy", PLAN, serving_version=7)
    return apply(state, start_decision(state, 8, operator="ops"))


def _fed(state: ReleaseState, serving: np.ndarray, candidate: np.ndarray, *, serving_ok: float = 1.0,
         candidate_ok: float = 1.0, candidate_latency: float = 100.0, seed: int = 0) -> ReleaseState:
    rng = np.random.default_rng(seed)
    for version, values, ok_rate, latency in ((7, serving, serving_ok, 100.0),
                                              (8, candidate, candidate_ok, candidate_latency)):
        for value in values:
            state = fold_reward(state, RewardObservation(version, float(value)))
            state = fold_call(state, CallObservation(version, bool(rng.random() < ok_rate),
                                                     float(rng.exponential(latency))))
    return state


def _bernoulli(p: float, n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random(n) < p).astype(float)


def test_start_opens_a_release_at_the_first_stage_with_the_plan_pins() -> None:
    state = _started()
    assert (state.serving_version, state.candidate_version, state.candidate_fraction) == (7, 8, 0.1)
    assert state.pinned == {"eval": 2} and state.sequence == 1 and state.release_id


def test_observations_count_only_for_the_compared_unpinned_versions() -> None:
    state = _started()
    state = fold_reward(state, RewardObservation(8, 1.0))
    state = fold_reward(state, RewardObservation(8, 0.0, pinned=True))
    state = fold_reward(state, RewardObservation(3, 1.0))
    state = fold_call(state, CallObservation(7, ok=False, latency_ms=250.0))
    assert state.candidate == ArmStats(rewards=1, reward_total=1.0, reward_total_sq=1.0)
    assert state.serving == ArmStats(calls=1, errors=1, latency_ms_total=250.0)
    with pytest.raises(ValueError, match="finite"):
        fold_reward(state, RewardObservation(8, float("nan")))


def test_too_few_samples_hold() -> None:
    decision = decide(_fed(_started(), _bernoulli(0.5, 49, 1), _bernoulli(0.1, 49, 2)))
    assert (decision.action, decision.rule) == ("hold", "min_samples")
    assert "50 per version" in decision.reason


def test_a_worse_candidate_is_rolled_back_on_reward() -> None:
    decision = decide(_fed(_started(), _bernoulli(0.7, 400, 1), _bernoulli(0.3, 200, 2)))
    assert (decision.action, decision.rule) == ("rollback", "reward_worse")
    assert decision.interval_high is not None and decision.interval_high < 0
    assert decision.alpha == PLAN.guard_rails.alpha_rollback / 2


def test_enough_samples_in_a_stage_ramp_and_the_next_stage_counts_afresh() -> None:
    state = _fed(_started(), _bernoulli(0.5, 300, 1), _bernoulli(0.5, 60, 2))
    decision = decide(state)
    assert (decision.action, decision.rule) == ("ramp", "stage_samples")
    ramped = apply(state, decision)
    assert (ramped.stage, ramped.candidate_fraction, ramped.stage_start_rewards) == (1, 0.5, 60)
    assert ramped.candidate == state.candidate  # totals carry over a ramp; the test stays valid
    assert decide(ramped).action == "hold"


def test_a_better_candidate_at_the_last_stage_is_promoted() -> None:
    state = replace(_fed(_started(), _bernoulli(0.4, 600, 1), _bernoulli(0.7, 600, 2)), stage=1)
    decision = decide(state)
    assert (decision.action, decision.rule) == ("promote", "reward_better")
    assert decision.interval_low is not None and decision.interval_low > 0
    promoted = apply(state, decision)
    assert (promoted.serving_version, promoted.candidate_version, promoted.candidate_fraction) == (8, None, 0.0)
    assert promoted.candidate == ArmStats() == promoted.serving


def test_an_undecided_last_stage_holds() -> None:
    state = replace(_fed(_started(), _bernoulli(0.5, 200, 1), _bernoulli(0.5, 200, 2)), stage=1)
    assert (decide(state).action, decide(state).rule) == ("hold", "reward_undecided")


def test_errors_and_latency_roll_back_before_rewards_are_in() -> None:
    errors = _fed(_started(), _bernoulli(0.5, 300, 1), _bernoulli(0.5, 300, 2), serving_ok=0.99, candidate_ok=0.7)
    assert (decide(errors).action, decide(errors).rule) == ("rollback", "error_rate")
    slow = _fed(_started(), _bernoulli(0.5, 300, 1), _bernoulli(0.5, 300, 2), candidate_latency=400.0)
    decision = decide(slow)
    assert (decision.action, decision.rule) == ("rollback", "latency_ratio")
    assert "max 1.5x" in decision.reason


def test_operators_decisions_are_checked_against_the_state() -> None:
    idle = initial_state("policy", PLAN, serving_version=7)
    with pytest.raises(ReleaseError, match="no candidate"):
        manual_decision(idle, "promote", "ops")
    with pytest.raises(ReleaseError, match="already the serving version"):
        start_decision(idle, 7, "ops")
    started = _started()
    with pytest.raises(ReleaseError, match="already has candidate 8"):
        start_decision(started, 9, "ops")
    last = apply(started, manual_decision(started, "ramp", "ops"))
    with pytest.raises(ReleaseError, match="last stage"):
        manual_decision(last, "ramp", "ops")
    rolled_back = apply(last, manual_decision(last, "rollback", "ops", "bad answers in review"))
    assert (rolled_back.serving_version, rolled_back.candidate_version, rolled_back.sequence) == (7, None, 3)
    assert decide(rolled_back).rule == "no_candidate"


def test_pins_are_set_and_cleared() -> None:
    state = _started()
    pinned = apply(state, pin_decision(state, "canary-suite", 5, "ops"))
    assert pinned.pinned == {"eval": 2, "canary-suite": 5}
    cleared = apply(pinned, pin_decision(pinned, "eval", None, "ops"))
    assert cleared.pinned == {"canary-suite": 5}
    with pytest.raises(ReleaseError, match="not pinned"):
        pin_decision(cleared, "eval", None, "ops")


def test_the_same_pair_started_again_is_a_new_release() -> None:
    first = _started()
    rolled_back = apply(first, manual_decision(first, "rollback", "ops"))
    again = apply(rolled_back, start_decision(rolled_back, 8, "ops"))
    assert again.release_id != first.release_id
