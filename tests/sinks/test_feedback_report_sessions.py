"""The report's feedback figures for production traffic (sinks/feedback_report.py: summarize, pure): the
fraction of organic sessions with feedback, and the delay distribution per kind (p10, median, p90, max)."""

from __future__ import annotations

from processors.feedback.config import FeedbackRewardConfig
from processors.feedback.join import FeedbackJoin, FeedbackReward, RolloutRef, reward_record
from schemas.feedback import FeedbackValue, build_feedback
from sinks.feedback_report import summarize

S = 1_000_000
CFG = FeedbackRewardConfig(name="sessions-test", wait_s=dict.fromkeys(("BINARY", "RATING", "OUTCOME",
                                                                       "TASK_OUTCOME", "TEXT"), 100.0),
                           watermark_lag_s=1, match_wait_s=50, closed_retention_s=1000, combine="mean")


def test_session_coverage_and_delay_distribution() -> None:
    close = 1_000 * S
    refs = [RolloutRef(f"ev-{n}", rid, "a1", close, call_ids=(f"call-{n}",))
            for n, rid in enumerate(("session-aa-01", "session-aa-02", "session-bb-01", "lab-rollout"))]
    feedback = [build_feedback(source="ui", target_kind="CALL", target_id=f"call-{n}",
                               kind="BINARY", value=FeedbackValue(binary=True),
                               event_time_us=close + delay * S, created_at_us=close + delay * S + S // 2)
                for n, delay in ((0, 10), (0, 20), (2, 30), (3, 40))]  # session 1 has none
    join = FeedbackJoin(CFG)
    outputs = [o for ref in refs for o in join.add_rollout(ref)]
    for item in feedback:
        outputs += join.add_feedback(item)
    outputs += join.tick(close + 500 * S)
    rewards = [reward_record(o) for o in outputs if isinstance(o, FeedbackReward)]
    assert len(rewards) == 4

    summary = summarize(refs, feedback, rewards, letters=[])
    # Three organic session windows (the lab rollout is not one); two of them have feedback.
    assert (summary.sessions, summary.sessions_with_feedback) == (3, 2)
    assert summary.session_coverage == 2 / 3
    assert summary.coverage == [(CFG.id, 4, 3, 1)]
    (binary,) = summary.delays
    assert binary.count == 4 and binary.max_after_close_s == 40.0 and binary.median_after_close_s == 25.0
    assert binary.p10_after_close_s == 13.0 and binary.median_arrival_lag_s == 0.5
    assert summary.outcomes == {"admitted": 4}

    # Without organic sessions there is no session coverage to state.
    lab = summarize(refs[3:], feedback[3:], rewards[3:], letters=[])
    assert lab.sessions == 0 and lab.session_coverage is None
