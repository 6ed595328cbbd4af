"""The controller processor's core: calls and rewards in, decisions out, applied only when read back."""

from __future__ import annotations

import numpy as np

from processors.release.controller import initial_state, manual_decision, pin_decision, start_decision
from processors.release.events import Record, decision_record
from processors.release.feed import ReleaseFeed
from processors.release.plan import load_plan
from schemas.builders import make_call
from schemas.call_errors import CLIENT_DISCONNECTED

PLAN = load_plan({"ramp": [0.2, 0.5], "guard_rails": {"min_samples_per_arm": 30, "min_samples_per_stage": 30,
                                                      "min_calls_per_arm": 30}})
MODEL = "tiny"  # the model make_call records


def _start() -> Record:
    state = initial_state(MODEL, PLAN, serving_version=4)
    record, _ = decision_record(state, start_decision(state, 5, "ops", plan=PLAN), created_at_us=1)
    return record


def _rollout(i: int, version: int, reward: float, release: Record | None = None,
             **call: object) -> tuple[Record, Record]:
    rid = f"r{i}"
    c = make_call(rid, "a0", 0, [1, 2, 3], [4, 5], policy_version=version, **call)  # type: ignore[arg-type]
    c["release"] = release  # CallRecord.release: the release arm the gateway routed the call on
    reward_record = {"rollout_id": rid, "raw_reward": reward, "reward": 0.0, "filtered": False,
                     "filter_reason": None, "created_at_us": 10_000 + i}
    return c, reward_record


def _traffic(n: int, p_serving: float, p_candidate: float, seed: int, offset: int = 0) -> list[tuple[Record, Record]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(offset, offset + n):
        version = 5 if i % 2 else 4
        p = p_candidate if version == 5 else p_serving
        out.append(_rollout(i, version, float(rng.random() < p)))
    return out


def _feed(feed: ReleaseFeed, traffic: list[tuple[Record, Record]]) -> list[Record]:
    written = []
    for call, reward in traffic:
        written += feed.on_call(call)
        written += feed.on_reward(reward)
    return written


def test_a_better_candidate_is_ramped_then_promoted_each_decision_applied_when_read_back() -> None:
    feed = ReleaseFeed()
    feed.on_decision(_start())
    written = _feed(feed, _traffic(200, 0.3, 0.85, seed=1))
    assert [r["action"] for r in written] == ["ramp"]  # one decision, then it waits to read it back
    ramp = written[0]
    assert (ramp["source"], ramp["rule"], ramp["sequence"]) == ("controller", "stage_samples", 1)
    assert feed.states[MODEL].stage == 0 and MODEL in feed.pending
    counted = feed.states[MODEL].candidate.rewards
    feed.on_decision(ramp)
    state = feed.states[MODEL]
    assert (state.stage, state.candidate.rewards, state.stage_start_rewards) == (1, counted, ramp["candidate_rewards"])
    written = _feed(feed, _traffic(2, 0.3, 0.85, seed=2, offset=200))
    assert [r["action"] for r in written] == ["promote"] and written[0]["interval_low"] > 0
    feed.on_decision(written[0])
    assert (feed.states[MODEL].serving_version, feed.states[MODEL].candidate_version) == (5, None)
    assert not feed.pending and feed.counts["decisions"] == 3
    assert _feed(feed, _traffic(50, 0.3, 0.85, seed=3, offset=300)) == []  # no release: nothing to decide


def test_an_operators_decision_first_on_the_topic_wins_over_the_controllers() -> None:
    feed = ReleaseFeed()
    start = _start()
    feed.on_decision(start)
    [ramp] = _feed(feed, _traffic(200, 0.5, 0.5, seed=4))
    before = initial_state(MODEL, PLAN, 4)
    _, after_start = decision_record(before, start_decision(before, 5, "ops", plan=PLAN), created_at_us=1)
    rollback, _ = decision_record(after_start, manual_decision(after_start, "rollback", "ops"), created_at_us=2)
    feed.on_decision(rollback)
    feed.on_decision(ramp)  # ours, read back after the operator's: stale
    assert feed.states[MODEL].candidate_version is None and not feed.pending
    assert feed.skipped["stale or malformed decision"] == 1


def test_inputs_that_are_no_observation_are_skipped_by_reason() -> None:
    feed = ReleaseFeed()
    feed.on_decision(_start())
    scripted, _ = _rollout(1, 5, 1.0, scripted=True)
    assert feed.on_call(scripted) == []
    call, reward = _rollout(2, 5, 1.0)
    feed.on_call(call)
    assert feed.on_reward({**reward, "filtered": True, "filter_reason": "score_error: TIMEOUT"}) == []
    assert feed.on_reward({**reward, "rollout_id": "never-seen"}) == []
    assert list(feed.waiting) == ["never-seen"]  # waits for its calls
    feed.on_call(make_call("r2", "a0", 1, [1, 2, 3], [4], policy_version=4))  # the same rollout on serving
    assert feed.on_reward(reward) == []
    nan_call, nan_reward = _rollout(3, 5, float("nan"), total_ms=float("inf"))
    assert feed.on_call(nan_call) == [] and feed.on_reward(nan_reward) == []
    assert feed.skipped == {"scripted call": 1, "reward filtered for a score error": 1,
                            "reward of a rollout served by several versions": 1,
                            "call whose latency is not a finite number": 1, "reward that is not a finite number": 1}
    assert feed.states[MODEL].candidate.rewards == 0 and feed.states[MODEL].candidate.calls == 1


def test_a_restarted_controller_resumes_from_the_topics() -> None:
    """Folding the decisions, then re-reading calls and rewards from the release's start, gives the state
    the running controller had."""
    running = ReleaseFeed()
    start = _start()
    running.on_decision(start)
    first = _traffic(200, 0.5, 0.55, seed=5)
    [ramp] = _feed(running, first)
    running.on_decision(ramp)
    later = _traffic(40, 0.5, 0.55, seed=6, offset=200)
    assert _feed(running, later) == []

    restarted = ReleaseFeed()
    for record in (start, ramp):
        restarted.on_decision(record)
    assert restarted.release_starts_us() == {MODEL: start["created_at_us"]}
    assert _feed(restarted, first + later) == []
    assert restarted.states[MODEL] == running.states[MODEL]


def test_rewards_read_before_their_calls_wait_for_them() -> None:
    traffic = _traffic(200, 0.3, 0.85, seed=1)
    in_order = ReleaseFeed()
    in_order.on_decision(_start())
    expected = _feed(in_order, traffic)
    rewards_first = ReleaseFeed()
    rewards_first.on_decision(_start())
    assert [d for _, reward in traffic for d in rewards_first.on_reward(reward)] == []
    written = [d for call, _ in traffic for d in rewards_first.on_call(call)]
    assert [r["action"] for r in written] == [r["action"] for r in expected] == ["ramp"]
    assert rewards_first.states[MODEL].candidate.rewards == in_order.states[MODEL].candidate.rewards
    assert not rewards_first.waiting


def test_the_rollout_map_and_the_waiting_rewards_are_bounded() -> None:
    feed = ReleaseFeed(max_rollouts=10, max_waiting=5)
    for call, _ in _traffic(25, 0.5, 0.5, seed=7):
        feed.on_call(call)
    assert list(feed.rollouts) == [f"r{i}" for i in range(15, 25)]
    for _, reward in _traffic(8, 0.5, 0.5, seed=8, offset=100):
        feed.on_reward(reward)
    assert list(feed.waiting) == [f"r{i}" for i in range(103, 108)]
    assert feed.skipped["reward of a rollout with no call seen"] == 3


def test_rewards_of_one_source_are_compared_never_verifier_and_feedback_rewards_mixed() -> None:
    import json

    traffic = _traffic(40, 0.5, 0.5, seed=3)
    as_feedback = [(c, {**r, "components_json": json.dumps({"source": "feedback", "admitted": []})})
                   for c, r in traffic]
    verifier, feedback = ReleaseFeed(), ReleaseFeed(source="feedback")
    for feed in (verifier, feedback):
        feed.on_decision(_start())
        _feed(feed, traffic + as_feedback)
    for feed in (verifier, feedback):
        state = feed.states[MODEL]
        assert state.candidate.rewards + state.serving.rewards == 40  # one source's 40, not 80
        assert sum(n for reason, n in feed.skipped.items() if "other source" in reason) == 40
    # Each source's rewards are the ones counted: the same draws, so the same totals.
    assert verifier.states[MODEL].candidate == feedback.states[MODEL].candidate


def test_a_reward_measured_against_a_baseline_is_never_counted_again_under_either_source() -> None:
    import json

    traffic = _traffic(30, 0.5, 0.5, seed=5)
    as_feedback = [(c, {**r, "components_json": json.dumps({"source": "feedback", "admitted": []})})
                   for c, r in traffic]
    # Baselines without siblings restate each feedback reward (same raw_reward) against its window's baseline.
    as_baseline = [(c, {**r,
                        "components_json": json.dumps({"source": "baseline", "baseline_id": "w1"})})
                   for c, r in traffic]
    verifier, feedback = ReleaseFeed(), ReleaseFeed(source="feedback")
    for feed in (verifier, feedback):
        feed.on_decision(_start())
        _feed(feed, traffic + as_feedback + as_baseline)
        state = feed.states[MODEL]
        assert state.candidate.rewards + state.serving.rewards == 30
        assert sum(n for reason, n in feed.skipped.items() if "baseline" in reason) == 30


def _release(start: Record, arm: str, sequence: int = 0, pin_label: str | None = None,
             release_id: str | None = None) -> Record:
    """A call's CallRecord.release, as the gateway writes it."""
    return {"release_id": release_id or start["release_id"], "decision_sequence": sequence, "arm": arm,
            "pin_label": pin_label}


def test_pinned_traffic_is_counted_per_pin_and_kept_out_of_the_comparison() -> None:
    feed = ReleaseFeed()
    state = initial_state(MODEL, PLAN, serving_version=4)
    start, state = decision_record(state, start_decision(state, 5, "ops", plan=PLAN), created_at_us=1)
    pin, state = decision_record(state, pin_decision(state, "eval-suite", 5, "ops"), created_at_us=2)
    feed.on_decision(start)
    feed.on_decision(pin)
    # An evaluation suite pinned to the candidate's version, answering badly: not a word in the comparison.
    for i in range(100):
        call, reward = _rollout(i, 5, 0.0, release=_release(start, "pinned", 1, pin_label="eval-suite"))
        assert feed.on_call(call) == [] and feed.on_reward(reward) == []
    state = feed.states[MODEL]
    assert state.candidate == state.serving and state.candidate.calls == 0
    assert feed.pinned == {(MODEL, "eval-suite", "calls"): 100, (MODEL, "eval-suite", "rewards"): 100}
    # A later unpinned call of a pinned rollout does not bring it into the comparison.
    later, reward = _rollout(7, 5, 1.0, release=_release(start, "candidate", 1))
    feed.on_call(later)
    assert feed.on_reward(reward) == [] and feed.states[MODEL].candidate.rewards == 0
    assert feed.states[MODEL].candidate.calls == 1  # the call itself was routed as candidate traffic
    # The same traffic unpinned is compared, and the bad candidate is rolled back.
    written = []
    for i in range(100, 300):
        version = 5 if i % 2 else 4
        arm = "candidate" if version == 5 else "serving"
        call, reward = _rollout(i, version, float(version == 4), release=_release(start, arm, 1))
        written += feed.on_call(call) + feed.on_reward(reward)
    assert [r["action"] for r in written] == ["rollback"] and not feed.arm_disagreements


def test_the_arm_on_the_record_is_checked_against_the_decision_log() -> None:
    feed = ReleaseFeed()
    start = _start()  # serving 4, candidate 5
    feed.on_decision(start)
    agree = [(5, _release(start, "candidate")), (4, _release(start, "serving")),
             (4, _release(start, "candidate", sequence=9))]  # a decision the controller has not read: unchecked
    for i, (version, release) in enumerate(agree):
        feed.on_call(_rollout(i, version, 1.0, release=release)[0])
    assert not feed.arm_disagreements
    # Routed to the candidate, but the tokens came from serving's weights (an upstream that serves one
    # version); routed by a release the log does not have at that decision; not routed at all: unchecked.
    disagree = [(4, _release(start, "candidate")), (5, _release(start, "candidate", release_id="other")),
                (5, None)]
    for i, (version, release) in enumerate(disagree, start=10):
        feed.on_call(_rollout(i, version, 1.0, release=release)[0])
    assert feed.arm_disagreements == {(MODEL, "candidate"): 2}
    # After a rollback read back, a call routed by the rollback is serving traffic of serving's version.
    state = initial_state(MODEL, PLAN, 4)
    _, state = decision_record(state, start_decision(state, 5, "ops", plan=PLAN), created_at_us=1)
    rollback, _ = decision_record(state, manual_decision(state, "rollback", "ops"), created_at_us=2)
    feed.on_decision(rollback)
    feed.on_call(_rollout(20, 4, 1.0, release=_release(start, "serving", sequence=1))[0])
    feed.on_call(_rollout(21, 5, 1.0, release=_release(start, "candidate", sequence=0))[0])  # routed before it
    assert feed.arm_disagreements == {(MODEL, "candidate"): 2}


def test_calls_the_client_aborted_are_counted_apart_never_as_the_versions_errors() -> None:
    """A caller that aborts streams on candidate sessions (issue 29, finding 7) cannot force a rollback: its
    aborted calls are no observation of the policy; an upstream error on the candidate still is one."""
    feed = ReleaseFeed()
    feed.on_decision(_start())
    written = _feed(feed, _traffic(80, 0.5, 0.5, seed=3))  # good traffic before (a ramp)
    for decision in written:
        feed.on_decision(decision)  # read back
    for i in range(200):
        aborted, _ = _rollout(1000 + i, 5, 0.0, status="ERROR", total_ms=60_000.0)
        aborted["error"] = {"type": CLIENT_DISCONNECTED, "message": "gone", "status_code": 499}
        written += feed.on_call(aborted)
    assert [d["action"] for d in written] == ["ramp"]
    assert feed.client_aborts == {(MODEL, 5): 200}
    state = feed.states[MODEL]
    assert state.candidate.calls == 40 and state.candidate.errors == 0 and state.candidate_version == 5
    failed, _ = _rollout(2000, 5, 0.0, status="ERROR")  # the policy's own error: observed as one
    feed.on_call(failed)
    assert feed.states[MODEL].candidate.errors == 1
    _feed(feed, _traffic(4, 0.5, 0.5, seed=4, offset=3000))  # good traffic after
    assert feed.states[MODEL].candidate.calls == 43
