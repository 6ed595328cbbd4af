"""Feedback rewards as replay derives them: from every stored rollout and feedback event at once, by event
time alone. Feedback the stream recorded as late (it arrived after the window closed) counts here if its
event time is within its kind's wait; so replay under a configuration admits late feedback and re-derives
rewards that differ exactly where it landed, while the original rewards stay."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from processors.feedback.config import FeedbackRewardConfig
from processors.feedback.join import FeedbackJoin, FeedbackReward, RolloutRef, target_key

Record = dict[str, Any]


def event_time_rewards(rollouts: Iterable[RolloutRef], feedback: Iterable[Record],
                       cfg: FeedbackRewardConfig) -> list[FeedbackReward]:
    """Each rollout's reward over all the feedback naming it within its kind's wait, in rollout order."""
    by_target: dict[tuple[str, str], list[Record]] = {}
    for item in feedback:
        key = target_key(item)
        if key is not None:
            by_target.setdefault(key, []).append(item)
    join = FeedbackJoin(cfg)  # only for its reward rule: nothing is folded into it
    rewards = []
    for ref in rollouts:
        admitted = {f["event_id"]: f for key in ref.target_keys() for f in by_target.get(key, ())
                    if f["event_time_us"] <= ref.closed_at_us + cfg.wait_us(f["kind"])}
        rewards.append(join.reward_of(ref, list(admitted.values())))
    return rewards
