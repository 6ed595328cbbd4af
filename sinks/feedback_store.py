"""What the feedback join left in ClickHouse, read back for replay, the audit and the report.

Feedback rewards are the ``rewards`` rows whose ``components_json`` says ``"source": "feedback"``
(``processors.feedback.join.reward_record``); late, unmatched and invalid feedback are ``dead_letters``
rows of the stages below, each holding the feedback's own bytes, so the feedback id is read from them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from processors.feedback.join import LATE_STAGE, STAGE, RolloutRef
from schemas.codec import DecodeError, get_codec
from sinks.rows import Record
from sinks.store import load_records, select_rows

ROUTER_STAGE = "feedback_router"  # processors/stream/feedback/router.py: invalid feedback
FEEDBACK_STAGES = (STAGE, LATE_STAGE, ROUTER_STAGE)
IS_FEEDBACK_REWARD = "JSONExtractString(components_json, 'source') = 'feedback'"


def load_rollout_refs(client: Client) -> list[RolloutRef]:
    """Every stored COMPLETE rollout attempt as the join sees it, with its calls' session ids."""
    rows = select_rows(client, "rollouts", "status = 'COMPLETE'",
                       columns="event_id, rollout_id, attempt_id, created_at_us, c_call_id, group_id",
                       order_by="created_at_us, event_id", rebuild=False)
    sessions: dict[tuple[str, str], list[str]] = defaultdict(list)
    for rollout_id, attempt_id, session_id in client.query(
            "SELECT DISTINCT rollout_id, attempt_id, session_id FROM calls FINAL WHERE session_id IS NOT NULL "
            "ORDER BY rollout_id, attempt_id, session_id").result_rows:
        sessions[(rollout_id, attempt_id)].append(session_id)
    return [RolloutRef(r["event_id"], r["rollout_id"], r["attempt_id"], int(r["created_at_us"]),
                       tuple(r["c_call_id"]), tuple(sessions.get((r["rollout_id"], r["attempt_id"]), ())),
                       r["group_id"] or "") for r in rows]


def load_feedback(client: Client) -> list[Record]:
    return load_records(client, "feedback", order_by="event_time_us, event_id")


def load_feedback_rewards(client: Client) -> list[Record]:
    return load_records(client, "rewards", IS_FEEDBACK_REWARD, order_by="created_at_us, event_id")


def components(reward: Record) -> dict[str, Any]:
    return orjson.loads(reward["components_json"] or "{}")


@dataclass(frozen=True)
class FeedbackLetter:
    """A dead letter about one feedback: late (feedback_late), unmatched (feedback_join) or invalid."""

    feedback_id: str | None  # None: the letter's value is not a readable Feedback
    stage: str
    error_type: str
    reason: str
    created_at_us: int


def load_feedback_letters(client: Client) -> list[FeedbackLetter]:
    codec = get_codec()
    rows = load_records(client, "dead_letters", "stage IN {stages:Array(String)}", {"stages": list(FEEDBACK_STAGES)},
                        order_by="created_at_us, event_id")
    letters = []
    for row in rows:
        try:
            feedback_id = codec.decode(row["value"], expect="Feedback")[1]["event_id"]
        except DecodeError:
            feedback_id = None
        letters.append(FeedbackLetter(feedback_id, row["stage"], row["error_type"], row["reason"],
                                      int(row["created_at_us"])))
    return letters
