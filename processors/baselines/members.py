"""Which rewards the baselines read, and how a reward meets its rollout attempt; shared by the stream and
replay. Pure.

The baselines read feedback rewards (``processors.feedback.join.reward_record``: ``"source": "feedback"``),
the stream's own (replayed ones have ids of their own and are left out), not filtered, of the configured
feedback configuration if one is named. A feedback reward names its rollout id, not the attempt; its id is
``event_id("feedback_reward", rollout event id, config id)``, so the attempt it belongs to is found by
recomputing that id for each attempt.
"""

from __future__ import annotations

from typing import Any

import orjson

from processors.baselines.config import BaselineConfig
from processors.baselines.keys import first_user_message, message_key
from processors.baselines.windows import Member
from schemas.ids import event_id

Record = dict[str, Any]


def is_baseline_input(reward: Record, cfg: BaselineConfig) -> bool:
    try:
        components = orjson.loads(reward.get("components_json") or "{}")
    except orjson.JSONDecodeError:
        return False
    if not isinstance(components, dict) or components.get("source") != "feedback" or components.get("replay"):
        return False
    if reward.get("filtered"):
        return False
    return cfg.reward_config_id is None or reward["reward_config_id"] == cfg.reward_config_id


def reward_of_attempt(reward: Record, rollout_event_id: str) -> bool:
    """Whether a feedback reward was made for this rollout attempt."""
    return reward["event_id"] == event_id("feedback_reward", rollout_event_id, reward["reward_config_id"])


def member_of(rollout: Record, reward: Record) -> Member:
    """A rollout attempt with its reward; its event time is when the rollout completed."""
    return Member(rollout["event_id"], rollout["rollout_id"], reward["event_id"], float(reward["reward"]),
                  int(rollout["created_at_us"]))


def first_call_key(call: Record, cfg: BaselineConfig) -> str | None:
    """The cluster key of an attempt's first call (``key.by: first_user_message``)."""
    return message_key(first_user_message(call.get("request_json") or ""), cfg.key)
