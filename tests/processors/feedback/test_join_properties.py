"""Property tests of the feedback join: for any arrival order of rollouts, feedback and ticks, what the
incremental join emits equals a batch computation over the same events with the same watermarks; and
where arrival disorder stays within the watermark lag, every order gives the rewards replay derives
from event time alone (processors/feedback/replay.py)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from processors.feedback.combine import combine
from processors.feedback.config import FeedbackRewardConfig
from processors.feedback.join import (
    FeedbackJoin,
    FeedbackReward,
    LateFeedback,
    Output,
    RolloutRef,
    UnmatchedFeedback,
    target_key,
)
from processors.feedback.replay import event_time_rewards

from .scenarios import T0, Input, S, event_time, scenarios

# Seeded and bounded: the same examples on every run, in seconds.
PROPERTY = settings(derandomize=True, max_examples=300, deadline=None)
FOREVER = 2**62

configs = st.builds(
    lambda waits, lag, match, keep, combine_rule, missing, supersede: FeedbackRewardConfig(
        wait_s=dict(zip(("BINARY", "RATING", "OUTCOME", "TASK_OUTCOME", "TEXT"), waits, strict=True)),
        watermark_lag_s=lag, match_wait_s=match, closed_retention_s=keep, combine=combine_rule,
        weights={"BINARY": 1.0, "OUTCOME": 2.0, "TASK_OUTCOME": 3.0}, missing=missing, supersede=supersede),
    st.lists(st.integers(0, 20), min_size=5, max_size=5), st.integers(0, 15), st.integers(0, 40),
    st.integers(0, 40), st.sampled_from(["latest", "mean", "first_terminal", "weighted"]),
    st.sampled_from(["exclude", "default"]), st.sampled_from(["replace", "keep"]))


@dataclass(frozen=True)
class Emitted:
    rewards: dict[str, tuple[int, FeedbackReward]]  # rollout event id -> (step, reward)
    late: set[tuple[str, str, str]]
    unmatched: dict[str, int]  # feedback id -> step


def run_stream(cfg: FeedbackRewardConfig, arrivals: list[Input]) -> Emitted:
    join = FeedbackJoin(cfg)
    rewards, late, unmatched = {}, set(), {}
    for step, (kind, value) in enumerate(arrivals):
        outputs: list[Output] = (join.add_rollout(value) if kind == "rollout" else
                                 join.add_feedback(value) if kind == "feedback" else join.tick(value))
        for out in outputs:
            if isinstance(out, FeedbackReward):
                assert out.rollout_event_id not in rewards, "a rollout's reward is emitted once"
                rewards[out.rollout_event_id] = (step, out)
            elif isinstance(out, LateFeedback):
                late.add((out.feedback_id, out.rollout_event_id, out.reason))
            else:
                assert isinstance(out, UnmatchedFeedback) and out.feedback_id not in unmatched
                unmatched[out.feedback_id] = step
    return Emitted(rewards, late, unmatched)


def first_step(watermarks: list[int], start: int, beyond: int) -> int | None:
    """The first step from ``start`` on whose watermark is past ``beyond`` (None: never)."""
    return next((i for i in range(start, len(watermarks)) if watermarks[i] > beyond), None)


def run_batch(cfg: FeedbackRewardConfig, arrivals: list[Input]) -> Emitted:
    """The same semantics computed over the whole sequence at once, pair by pair, from the watermark each
    step ends with: when each rollout closes and is forgotten, when each feedback stops waiting, and so
    which feedback meets which rollout, and how."""
    watermarks, high = [], -FOREVER
    for item in arrivals:
        high = max(high, event_time(item))
        watermarks.append(high - cfg.lag_us)
    rollouts = [(p, v) for p, (k, v) in enumerate(arrivals) if k == "rollout"]
    feedback = [(q, v) for q, (k, v) in enumerate(arrivals) if k == "feedback"]
    closes: dict[str, int | None] = {}
    forgets: dict[str, int] = {}
    for p, ref in rollouts:
        end = ref.closed_at_us + cfg.window_us
        closes[ref.rollout_event_id] = c = first_step(watermarks, p, end)
        forget = None if c is None else first_step(watermarks, c, end + cfg.retention_us)
        forgets[ref.rollout_event_id] = FOREVER if forget is None else forget
    admitted: dict[str, list[dict]] = {ref.rollout_event_id: [] for _, ref in rollouts}
    late, unmatched = set(), {}
    for q, f in feedback:
        key = target_key(f)
        if key is None:
            unmatched[f["event_id"]] = q
            continue
        expiry = first_step(watermarks, q, f["event_time_us"] + cfg.match_wait_us)
        met = False
        for p, ref in rollouts:
            if key not in ref.target_keys():
                continue
            rid, close = ref.rollout_event_id, closes[ref.rollout_event_id]
            if p < q:  # the rollout was there first: known unless forgotten before this step
                if forgets[rid] < q:
                    continue
                open_then = close is None or close >= q
            else:  # the feedback was there first: still waiting when the rollout came?
                if expiry is not None and expiry < p:
                    continue
                open_then = True
            met = True
            if not open_then:
                late.add((f["event_id"], rid, "after_close"))
            elif f["event_time_us"] > ref.closed_at_us + cfg.wait_us(f["kind"]):
                late.add((f["event_id"], rid, "outside_window"))
            else:
                admitted[rid].append(f)
        if not met and expiry is not None:
            unmatched[f["event_id"]] = expiry
    rewards = {}
    for _, ref in rollouts:
        close = closes[ref.rollout_event_id]
        if close is not None:
            rewards[ref.rollout_event_id] = (close, expected_reward(cfg, ref, admitted[ref.rollout_event_id]))
    return Emitted(rewards, late, unmatched)


def expected_reward(cfg: FeedbackRewardConfig, ref: RolloutRef, admitted: list[dict]) -> FeedbackReward:
    combined = combine(admitted, cfg)
    value, defaulted = combined.value, False
    if value is None and cfg.missing == "default":
        value, defaulted = cfg.default, True
    order = sorted(admitted, key=lambda f: (f["event_time_us"], f["event_id"]))
    return FeedbackReward(ref.rollout_event_id, ref.rollout_id, ref.attempt_id, ref.group_id, cfg.id, value,
                          defaulted, tuple(f["event_id"] for f in order), combined.used_ids,
                          combined.superseded_ids, ref.closed_at_us + cfg.window_us)


@PROPERTY
@given(scenario=scenarios(), cfg=configs, order=st.randoms(use_true_random=False), end=st.booleans())
def test_stream_equals_batch_for_any_arrival_order(scenario: list[Input], cfg: FeedbackRewardConfig,
                                                    order: object, end: bool) -> None:
    arrivals = list(scenario)
    order.shuffle(arrivals)  # type: ignore[attr-defined]
    if end:  # the end of a replay: event time far past every window and wait
        arrivals.append(("tick", T0 + 10_000 * S))
    assert run_stream(cfg, arrivals) == run_batch(cfg, arrivals)


@PROPERTY
@given(scenario=scenarios(), cfg=configs, order=st.randoms(use_true_random=False))
def test_disorder_within_the_lag_gives_the_event_time_rewards_in_any_order(
        scenario: list[Input], cfg: FeedbackRewardConfig, order: object) -> None:
    # Every input arrives before the watermark passes anything it could affect: a lag wider than the
    # scenario's whole event-time span, and a match wait long enough to outlast it too.
    roomy = cfg.model_copy(update={"watermark_lag_s": 1000.0, "match_wait_s": 1000.0})
    arrivals = list(scenario)
    order.shuffle(arrivals)  # type: ignore[attr-defined]
    arrivals.append(("tick", T0 + 10_000 * S))
    emitted = run_stream(roomy, arrivals)
    replayed = event_time_rewards([v for k, v in scenario if k == "rollout"],
                                  [v for k, v in scenario if k == "feedback"], roomy)
    assert {rid: reward for rid, (_, reward) in emitted.rewards.items()} == {r.rollout_event_id: r for r in replayed}
    assert not any(reason == "after_close" for _, _, reason in emitted.late)
