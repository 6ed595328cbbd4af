"""What a set of admitted feedback is worth under a feedback-reward configuration. Pure.

Feedback is always taken in event-time order (ties by event id), so a stream and a batch that admit the
same feedback get bit-identical sums whatever order it arrived in."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from processors.feedback.config import FeedbackRewardConfig

Record = dict[str, Any]


def counted_time_us(feedback: Record) -> int:
    """When a feedback counts: its event time, but never after it was made (``created_at_us``, the arrival
    time its publisher stamps). A time claimed ahead of that would let its poster close windows early and
    win ``latest`` / ``first_terminal`` (issue 29); the event id still hashes the time as claimed."""
    return min(feedback["event_time_us"], feedback["created_at_us"])


def event_order(feedback: Record) -> tuple[int, str]:
    return counted_time_us(feedback), feedback["event_id"]


def feedback_value(feedback: Record, cfg: FeedbackRewardConfig) -> float | None:
    """The number one feedback stands for; None for TEXT (and for a record missing its value)."""
    v, kind = cfg.values, feedback["kind"]
    if kind == "BINARY" and feedback["binary"] is not None:
        return v.binary_true if feedback["binary"] else v.binary_false
    if kind == "RATING" and feedback["rating"] is not None:
        low, high = feedback["rating_min"], feedback["rating_max"]
        if not high > low:
            return None
        fraction = min(max((feedback["rating"] - low) / (high - low), 0.0), 1.0)
        return v.rating_low + (v.rating_high - v.rating_low) * fraction
    if kind == "OUTCOME":
        if feedback["outcome"] == "ACCEPTED":
            return v.accepted
        if feedback["outcome"] == "REJECTED":
            return v.rejected
        if feedback["outcome"] == "EDITED":
            if v.edited_by_distance and feedback["edit_distance"] is not None:
                return v.accepted - (v.accepted - v.rejected) * feedback["edit_distance"]
            return v.edited
    if kind == "TASK_OUTCOME" and feedback["task_success"] is not None:
        return v.task_success if feedback["task_success"] else v.task_failure
    return None


@dataclass(frozen=True)
class Combined:
    value: float | None  # None: no usable value (the config's ``missing`` rule decides)
    used_ids: tuple[str, ...]  # the feedback that produced the value, in event-time order
    superseded_ids: tuple[str, ...]  # admitted, but replaced by a revision (supersede: replace)


def effective(admitted: list[Record], cfg: FeedbackRewardConfig) -> tuple[list[Record], list[str]]:
    """The admitted feedback that stands (event-time order) and the ids revisions replaced."""
    ordered = sorted(admitted, key=event_order)
    if cfg.supersede == "keep":
        return ordered, []
    replaced = {f["supersedes"] for f in ordered if f["supersedes"] is not None}
    return [f for f in ordered if f["event_id"] not in replaced], [f["event_id"] for f in ordered
                                                                   if f["event_id"] in replaced]


def combine(admitted: list[Record], cfg: FeedbackRewardConfig) -> Combined:
    standing, superseded = effective(admitted, cfg)
    valued = [(f, value) for f in standing if (value := feedback_value(f, cfg)) is not None]
    chosen: list[tuple[Record, float]]
    result: float | None
    if cfg.combine == "latest":
        chosen = valued[-1:]
        result = chosen[0][1] if chosen else None
    elif cfg.combine == "mean":
        chosen = valued
        result = math.fsum(v for _, v in chosen) / len(chosen) if chosen else None
    elif cfg.combine == "first_terminal":
        chosen = [(f, v) for f, v in valued if f["kind"] in cfg.terminal_kinds][:1]
        result = chosen[0][1] if chosen else None
    else:  # weighted: sum_k w_k * mean_k / sum of the weights of the kinds present
        chosen = [(f, v) for f, v in valued if cfg.weights.get(f["kind"], 0.0) > 0]
        by_kind: dict[str, list[float]] = {}
        for f, v in chosen:
            by_kind.setdefault(f["kind"], []).append(v)
        total = math.fsum(cfg.weights[k] for k in sorted(by_kind))
        result = (math.fsum(cfg.weights[k] * math.fsum(vs) / len(vs) for k, vs in sorted(by_kind.items()))
                  / total) if by_kind else None
    return Combined(result, tuple(f["event_id"] for f, _ in chosen), tuple(superseded))
