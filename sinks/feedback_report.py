"""The report's feedback figures (issue 21): coverage (of rollouts, and of organic sessions), the delay
distribution per kind, late and unmatched counts.

Computed from what the feedback join stored (sinks/feedback_store.py); pure over the loaded records
(``summarize``), so the figures are tested without a report around them."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
from clickhouse_connect.driver.client import Client

from processors.feedback.join import LATE_STAGE, STAGE, RolloutRef, target_key
from sinks.feedback_store import (
    ROUTER_STAGE,
    FeedbackLetter,
    components,
    load_feedback,
    load_feedback_letters,
    load_feedback_rewards,
    load_rollout_refs,
)
from sinks.rows import Record

S = 1e6
# Rollout ids of organic session windows (producers/gateway/sessions.py: ROLLOUT_PREFIX; sinks may not
# import the gateway).
SESSION_PREFIX = "session-"


@dataclass(frozen=True)
class KindDelay:
    kind: str
    count: int
    median_after_close_s: float | None  # event time - the named rollout's close (first attempt found)
    p90_after_close_s: float | None
    median_arrival_lag_s: float  # created (received) - event time
    p10_after_close_s: float | None = None
    max_after_close_s: float | None = None


@dataclass
class FeedbackSummary:
    rollouts: int = 0
    feedback: int = 0
    coverage: list[tuple[str, int, int, int]] = field(default_factory=list)  # config, rewards, valued, filtered
    sessions: int = 0  # completed organic session windows
    sessions_with_feedback: int = 0  # of those, with a feedback reward that has a value
    delays: list[KindDelay] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)  # admitted, late (reason), unmatched, invalid, pending

    @property
    def session_coverage(self) -> float | None:
        """The fraction of organic sessions with feedback (None without sessions)."""
        return self.sessions_with_feedback / self.sessions if self.sessions else None

    @property
    def empty(self) -> bool:
        return not self.feedback and not self.coverage


def _quantile(values: list[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


def _late_reason(letter: FeedbackLetter) -> str:
    for reason in ("after_close", "outside_window"):
        if f"({reason})" in letter.reason:
            return reason
    return "other"


def summarize(refs: list[RolloutRef], feedback: list[Record], rewards: list[Record],
              letters: list[FeedbackLetter]) -> FeedbackSummary:
    out = FeedbackSummary(rollouts=len(refs), feedback=len(feedback))
    stream = [r for r in rewards if not components(r).get("replay")]
    per_config: dict[str, list[Record]] = defaultdict(list)
    for reward in stream:
        per_config[reward["reward_config_id"]].append(reward)
    out.coverage = [(cid, len(rs), sum(not r["filtered"] for r in rs), sum(r["filtered"] for r in rs))
                    for cid, rs in sorted(per_config.items())]
    valued = {r["rollout_id"] for r in stream if not r["filtered"]}
    sessions = {ref.rollout_id for ref in refs if ref.rollout_id.startswith(SESSION_PREFIX)}
    out.sessions, out.sessions_with_feedback = len(sessions), len(sessions & valued)
    closes: dict[tuple[str, str], int] = {}
    for ref in refs:
        for key in ref.target_keys():
            closes.setdefault(key, ref.closed_at_us)
    by_kind: dict[str, list[Record]] = defaultdict(list)
    for item in feedback:
        by_kind[item["kind"]].append(item)
    for kind, items in sorted(by_kind.items()):
        after = [(f["event_time_us"] - closes[k]) / S for f in items
                 if (k := target_key(f)) is not None and k in closes]
        lag = [(f["created_at_us"] - f["event_time_us"]) / S for f in items]
        out.delays.append(KindDelay(kind, len(items), _quantile(after, 0.5), _quantile(after, 0.9),
                                    float(np.median(lag)), _quantile(after, 0.1), max(after, default=None)))
    admitted = {fid for r in stream for fid in components(r).get("admitted", [])}
    stages: dict[str, str] = {}
    for letter in letters:
        if letter.feedback_id is None:
            out.outcomes["invalid (unreadable)"] += 1
        elif letter.stage == LATE_STAGE:
            stages.setdefault(letter.feedback_id, f"late ({_late_reason(letter)})")
        elif letter.stage == STAGE:
            stages.setdefault(letter.feedback_id, "unmatched")
        elif letter.stage == ROUTER_STAGE:
            stages.setdefault(letter.feedback_id, "invalid")
    for item in feedback:
        fid = item["event_id"]
        out.outcomes["admitted" if fid in admitted else stages.get(fid, "pending")] += 1
    return out


def feedback_summary(client: Client) -> FeedbackSummary:
    return summarize(load_rollout_refs(client), load_feedback(client), load_feedback_rewards(client),
                     load_feedback_letters(client))
