"""Hostile feedback (issue 29, fault (m)): what a feedback poster can send to hurt the join, and how to tell
that it did not. Pure: the feedback to send for a group of rollouts, and the accounting of what came out.

* oversized: one feedback whose ``details`` alone is most of a Kafka record; kept three times in its
  rollout's join entry it made a changelog record Kafka refuses, and the worker crash-looped on it.
* flooding: many 16k-character text posts on one rollout (bytes), many small ratings on another (count), and
  many ratings on a rollout's session (the resolver's per-session state, before the session's calls are known).
* future-dated: one event time a century ahead with an honest creation time (it must count as made, not
  close windows), and one whose creation time is forged a century ahead too (refused on arrival).

Good feedback before and after all of it must still be joined; every feedback sent ends used, late,
unmatched or dead-lettered with its reason; the rollouts still become samples.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from schemas.feedback import FeedbackValue, build_feedback

Record = dict[str, Any]
S = 1_000_000
CENTURY_US = 100 * 365 * 86_400 * S
TEXT_CHARS = 16_000
# A join whose windows close seconds after the rollouts, and a per-key budget small enough that the floods
# reach it within a short test (the worker is given these; the defaults hold 1000 items and 4 MiB).
JOIN_CONFIG = {"name": "hostile-feedback", "wait_s": dict.fromkeys(("BINARY", "RATING", "OUTCOME", "TASK_OUTCOME",
                                                                    "TEXT"), 6.0),
               "watermark_lag_s": 1, "match_wait_s": 60, "closed_retention_s": 60, "combine": "latest"}
MAX_ITEMS = 12


@dataclass
class HostileFeedback:
    """What is sent, in order, and which feedback the join must use for which rollout."""

    sent: list[Record] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)  # feedback id -> what it is (good, oversized, ...)
    must_use: dict[str, str] = field(default_factory=dict)  # rollout id -> the feedback id its reward uses

    def add(self, what: str, record: Record) -> Record:
        self.sent.append(record)
        self.kinds[record["event_id"]] = what
        return record


def _post(target: str, kind: str, at_us: int, value: FeedbackValue, n: int, made_us: int | None = None,
          target_kind: str = "ROLLOUT") -> Record:
    return build_feedback(source="hostile", target_kind=target_kind, target_id=target, kind=kind, value=value,
                          event_time_us=at_us, created_at_us=made_us if made_us is not None else at_us + 5,
                          source_feedback_id=f"h-{n}")


def hostile_feedback(rollouts: list[str], close_us: int, now_us: int, *, oversized_bytes: int, floods: int,
                     session: str | None = None) -> HostileFeedback:
    """For four rollouts: good feedback on the first, the oversized one on the second, a text flood on the
    third, a rating flood on the fourth, the two future-dated ones on the first, then good feedback on the
    first again (the one its ``latest`` reward must use). ``now_us``: about when it reaches Kafka.
    ``session``: the second rollout's calls' session id, which then gets a rating flood of its own (it reaches
    the rollout through the resolver's per-session state)."""
    first, second, third, fourth = rollouts
    plan, n = HostileFeedback(), iter(range(1_000_000))
    plan.add("good", _post(first, "RATING", close_us + 1 * S, FeedbackValue(rating=0.2), next(n)))
    plan.add("oversized", _post(second, "RATING", close_us + 1 * S, FeedbackValue(
        rating=0.9, details={"blob": "x" * oversized_bytes}), next(n)))
    for i in range(floods if session else 0):
        plan.add("session flood", _post(session or "", "RATING", close_us + S + i, FeedbackValue(rating=0.3),
                                        next(n), target_kind="SESSION"))
    for i in range(floods):
        plan.add("text flood", _post(third, "TEXT", close_us + S + i, FeedbackValue(text="t" * TEXT_CHARS), next(n)))
    for i in range(floods):
        plan.add("rating flood", _post(fourth, "RATING", close_us + S + i, FeedbackValue(rating=0.5), next(n)))
    plan.add("future, made now", _post(first, "RATING", close_us + CENTURY_US, FeedbackValue(rating=1.0), next(n),
                                       made_us=close_us + 2 * S))
    plan.add("future, forged", _post(first, "RATING", now_us + CENTURY_US, FeedbackValue(rating=1.0), next(n)))
    last = plan.add("good", _post(first, "RATING", close_us + 3 * S, FeedbackValue(rating=0.7), next(n)))
    plan.must_use[first] = last["event_id"]
    return plan


def feedback_outcomes(plan: HostileFeedback, rewards: list[Record], letters: list[Record]) -> dict[str, Counter[str]]:
    """What became of each kind of feedback sent: admitted to a reward, or dead-lettered (by error type);
    'missing' counts feedback with neither (lost)."""
    import json

    admitted = {fid for r in rewards for fid in json.loads(r["components_json"]).get("admitted", [])}
    lettered: dict[str, str] = {}
    for letter in letters:
        for fid in plan.kinds:
            if fid in letter["reason"]:
                lettered.setdefault(fid, letter["error_type"])
    out: dict[str, Counter[str]] = {}
    for fid, what in plan.kinds.items():
        fate = "admitted" if fid in admitted else lettered.get(fid, "missing")
        out.setdefault(what, Counter())[fate] += 1
    return out
