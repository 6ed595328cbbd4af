"""Feedback rewards as replay derives them: from every stored rollout and feedback event at once, by event
time alone. Feedback the stream recorded as late (it arrived after the window closed) counts here if its
event time is within its kind's wait; so replay under a configuration admits late feedback and re-derives
rewards that differ exactly where it landed, while the original rewards stay."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from processors.feedback.combine import counted_time_us
from processors.feedback.config import FeedbackRewardConfig
from processors.feedback.join import FeedbackJoin, FeedbackReward, RolloutRef, reward_record, target_key
from schemas.ids import event_id

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
                    if counted_time_us(f) <= ref.closed_at_us + cfg.wait_us(f["kind"])}
        rewards.append(join.reward_of(ref, list(admitted.values())))
    return rewards


def replay_reward_record(reward: FeedbackReward) -> Record:
    """A replayed feedback reward as a Reward event. Its id is its own (``feedback_reward_replay``), never
    the stream's: under the same configuration replay may admit late feedback the stream did not, and one
    id must never name two contents. ``components_json`` says ``"replay": true``."""
    record = reward_record(reward)
    parts = dict(orjson.loads(record["components_json"]), replay=True)
    return dict(record, event_id=event_id("feedback_reward_replay", reward.rollout_event_id, reward.config_id),
                components_json=orjson.dumps(parts, option=orjson.OPT_SORT_KEYS).decode())
