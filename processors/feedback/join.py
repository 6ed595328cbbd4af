"""The feedback join: rollouts and feedback events in, feedback rewards, late and unmatched feedback out.

Pure and deterministic: no clock, no Kafka. Time is event time. The watermark is the largest event time
seen (a rollout's close time, a feedback's event time, or a ``tick``) minus ``watermark_lag_s``; it
never goes back. A feedback's time is its event time capped at its creation (``combine.counted_time_us``):
no feedback counts as happening after it was made. Each input is handled in three steps, always in this order:

1. match: a rollout meets every pending feedback that names it (its rollout id, a call id of it, or a
   session id of it); a feedback meets every known rollout it names. Against an open rollout, feedback
   whose event time is within its kind's wait after the rollout's close is admitted, later feedback is
   late (``outside_window``); against a closed rollout it is late (``after_close``).
2. close: every open rollout whose window end (close time + the longest wait) is below the watermark
   emits its feedback reward, in (window end, rollout) order.
3. expire: feedback still waiting ``match_wait_s`` after its event time stops waiting; if it met no
   rollout it is unmatched. Then closed rollouts past ``closed_retention_s`` are forgotten.

Late feedback is recorded, never used by the emitted reward; replay with a configuration that admits it
re-derives the reward (old events stay). Nothing is dropped: every feedback ends used, late or unmatched.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from processors.dead_letters import dead_letter
from processors.feedback.combine import combine, counted_time_us, event_order
from processors.feedback.config import FeedbackRewardConfig
from schemas.ids import event_id

Record = dict[str, Any]
TargetKey = tuple[str, str]  # ("rollout" | "call" | "session", id)
STAGE = "feedback_join"
LATE_STAGE = "feedback_late"  # late feedback is recorded as a dead letter of its own stage (docs/feedback.md)


@dataclass(frozen=True)
class RolloutRef:
    """What the join needs of a rollout: the ids feedback may name, and when it closed (event time)."""

    rollout_event_id: str  # the CompletedRollout's event id: one attempt of the rollout
    rollout_id: str
    attempt_id: str
    closed_at_us: int
    call_ids: tuple[str, ...] = ()
    session_ids: tuple[str, ...] = ()
    group_id: str = ""

    def target_keys(self) -> list[TargetKey]:
        return [("rollout", self.rollout_id), *(("call", c) for c in self.call_ids),
                *(("session", s) for s in self.session_ids)]


def rollout_ref(rollout: Record, session_ids: Iterable[str] = ()) -> RolloutRef:
    """The join's view of a CompletedRollout. The rollout record carries no session id; the caller
    passes the session ids of its calls (CallRecord.session_id) where it has them."""
    return RolloutRef(rollout["event_id"], rollout["rollout_id"], rollout["attempt_id"], rollout["created_at_us"],
                      tuple(rollout["call_ids"]), tuple(sorted(set(session_ids))), rollout.get("group_id") or "")


def target_key(feedback: Record) -> TargetKey | None:
    """The key a feedback names; None when a response or call target has no call id."""
    kind = feedback["target_kind"]
    if kind in ("RESPONSE", "CALL"):
        return ("call", feedback["call_id"]) if feedback["call_id"] else None
    return ("session" if kind == "SESSION" else "rollout", feedback["target_id"])


@dataclass(frozen=True)
class FeedbackReward:
    rollout_event_id: str
    rollout_id: str
    attempt_id: str
    group_id: str
    config_id: str
    reward: float | None  # None: excluded (no usable feedback and ``missing: exclude``)
    defaulted: bool  # the config's default, for want of feedback
    admitted_ids: tuple[str, ...]  # every feedback admitted to the window, event-time order
    used_ids: tuple[str, ...]  # those that produced the value
    superseded_ids: tuple[str, ...]
    window_end_us: int

    @property
    def excluded(self) -> bool:
        return self.reward is None


@dataclass(frozen=True)
class LateFeedback:
    feedback_id: str
    rollout_event_id: str
    reason: str  # "after_close" | "outside_window"


@dataclass(frozen=True)
class UnmatchedFeedback:
    feedback_id: str
    reason: str


Output = FeedbackReward | LateFeedback | UnmatchedFeedback


@dataclass
class _Open:
    ref: RolloutRef
    window_end_us: int
    admitted: dict[str, Record] = field(default_factory=dict)


@dataclass
class _Pending:
    feedback: Record
    expires_at_us: int
    matched: bool = False


class FeedbackJoin:
    """The join's state, folded one input at a time; each call returns the outputs it produced."""

    def __init__(self, cfg: FeedbackRewardConfig) -> None:
        self.cfg = cfg
        self.config_id = cfg.id
        self.max_event_us: int | None = None
        self.open: dict[str, _Open] = {}
        self.closed: dict[str, tuple[RolloutRef, int]] = {}  # rollout event id -> (ref, forget after)
        self.rollouts_by_target: dict[TargetKey, set[str]] = {}
        self.pending: dict[str, _Pending] = {}
        self.pending_by_target: dict[TargetKey, set[str]] = {}

    @property
    def watermark_us(self) -> int | None:
        return None if self.max_event_us is None else self.max_event_us - self.cfg.lag_us

    def next_due_us(self) -> int | None:
        """The earliest event time at which a ``tick`` changes something (a window closes, feedback
        stops waiting, a closed rollout is forgotten); None when the state holds nothing."""
        times = [w.window_end_us for w in self.open.values()] + [p.expires_at_us for p in self.pending.values()]
        times += [forget for _, forget in self.closed.values()]
        return min(times) + self.cfg.lag_us + 1 if times else None

    @property
    def empty(self) -> bool:
        return not (self.open or self.closed or self.pending)

    def snapshot(self) -> Record:
        """The state as plain JSON-able data (the stream keeps it in a changelogged table)."""
        return {"max_event_us": self.max_event_us,
                "open": [[ref_to_data(w.ref), w.window_end_us, list(w.admitted.values())]
                         for w in self.open.values()],
                "closed": [[ref_to_data(ref), forget] for ref, forget in self.closed.values()],
                "pending": [[p.feedback, p.expires_at_us, p.matched] for p in self.pending.values()]}

    @classmethod
    def restore(cls, cfg: FeedbackRewardConfig, data: Record) -> FeedbackJoin:
        """The join a ``snapshot`` was taken of: the same outputs for the same later inputs."""
        join = cls(cfg)
        join.max_event_us = data["max_event_us"]
        for ref_data, window_end_us, admitted in data["open"]:
            ref = ref_from_data(ref_data)
            join.open[ref.rollout_event_id] = _Open(ref, window_end_us, {f["event_id"]: f for f in admitted})
            join._index_rollout(ref)
        for ref_data, forget in data["closed"]:
            ref = ref_from_data(ref_data)
            join.closed[ref.rollout_event_id] = (ref, forget)
            join._index_rollout(ref)
        for feedback, expires_at_us, matched in data["pending"]:
            join.pending[feedback["event_id"]] = _Pending(feedback, expires_at_us, matched)
            key = target_key(feedback)
            assert key is not None  # only feedback with a target key ever waits
            join.pending_by_target.setdefault(key, set()).add(feedback["event_id"])
        return join

    def _index_rollout(self, ref: RolloutRef) -> None:
        for key in ref.target_keys():
            self.rollouts_by_target.setdefault(key, set()).add(ref.rollout_event_id)

    # -- inputs -------------------------------------------------------------------------------------

    def add_rollout(self, ref: RolloutRef) -> list[Output]:
        out: list[Output] = []
        if ref.rollout_event_id not in self.open and ref.rollout_event_id not in self.closed:  # else a re-delivery
            self.open[ref.rollout_event_id] = _Open(ref, ref.closed_at_us + self.cfg.window_us)
            waiting: set[str] = set()
            for key in ref.target_keys():
                self.rollouts_by_target.setdefault(key, set()).add(ref.rollout_event_id)
                waiting |= self.pending_by_target.get(key, set())
            for fid in sorted(waiting):
                out += self._match(self.pending[fid], ref.rollout_event_id)
        return out + self._advance(ref.closed_at_us)

    def add_feedback(self, feedback: Record) -> list[Output]:
        fid, key = feedback["event_id"], target_key(feedback)
        if key is None:
            return [UnmatchedFeedback(fid, f"{feedback['target_kind']} target {feedback['target_id']!r} names no "
                                           "call (a response id this gateway did not return?)")]
        out: list[Output] = []
        if fid not in self.pending:  # else a re-delivery of feedback still waiting
            pending = _Pending(feedback, counted_time_us(feedback) + self.cfg.match_wait_us)
            self.pending[fid] = pending
            self.pending_by_target.setdefault(key, set()).add(fid)
            for rid in sorted(self.rollouts_by_target.get(key, ())):
                out += self._match(pending, rid)
        return out + self._advance(counted_time_us(feedback))

    def waiting_unmatched(self) -> list[str]:
        """Feedback that waits and has met no rollout yet, oldest arrival first."""
        return [fid for fid, p in self.pending.items() if not p.matched]

    def withdraw(self, feedback_id: str) -> Record:
        """Forget a feedback that waits and has met no rollout (so no reward and no late record can name it);
        the stream sheds such feedback, newest first, to make room in a rollout's bounded state for the
        rollout's own attempt. Returns the feedback."""
        pending = self.pending[feedback_id]
        assert not pending.matched, f"feedback {feedback_id} met a rollout: it cannot be withdrawn"
        del self.pending[feedback_id]
        key = target_key(pending.feedback)
        assert key is not None
        self._discard(self.pending_by_target, key, feedback_id)
        return pending.feedback

    def tick(self, now_us: int) -> list[Output]:
        """Advance event time without an input (an idle partition; the end of a replay)."""
        return self._advance(now_us)

    # -- steps --------------------------------------------------------------------------------------

    def _match(self, pending: _Pending, rollout_event_id: str) -> list[Output]:
        pending.matched = True
        feedback = pending.feedback
        if rollout_event_id in self.closed:
            return [LateFeedback(feedback["event_id"], rollout_event_id, "after_close")]
        window = self.open[rollout_event_id]
        if counted_time_us(feedback) > window.ref.closed_at_us + self.cfg.wait_us(feedback["kind"]):
            return [LateFeedback(feedback["event_id"], rollout_event_id, "outside_window")]
        window.admitted[feedback["event_id"]] = feedback
        return []

    def _advance(self, event_time_us: int) -> list[Output]:
        if self.max_event_us is None or event_time_us > self.max_event_us:
            self.max_event_us = event_time_us
        watermark = self.watermark_us
        assert watermark is not None
        out: list[Output] = []
        closing = sorted((w.window_end_us, rid) for rid, w in self.open.items() if w.window_end_us < watermark)
        for _, rid in closing:
            window = self.open.pop(rid)
            out.append(self._reward(window))
            self.closed[rid] = (window.ref, window.window_end_us + self.cfg.retention_us)
        expiring = sorted((p.expires_at_us, fid) for fid, p in self.pending.items() if p.expires_at_us < watermark)
        for _, fid in expiring:
            pending = self.pending.pop(fid)
            key = target_key(pending.feedback)
            assert key is not None
            self._discard(self.pending_by_target, key, fid)
            if not pending.matched:
                out.append(UnmatchedFeedback(fid, unmatched_reason(pending.feedback, self.cfg.match_wait_s)))
        for rid in sorted(rid for rid, (_, forget) in self.closed.items() if forget < watermark):
            ref, _ = self.closed.pop(rid)
            for key in ref.target_keys():
                self._discard(self.rollouts_by_target, key, rid)
        return out

    @staticmethod
    def _discard(index: dict[TargetKey, set[str]], key: TargetKey, member: str) -> None:
        members = index.get(key)
        if members is not None:
            members.discard(member)
            if not members:
                del index[key]

    def _reward(self, window: _Open) -> FeedbackReward:
        return self.reward_of(window.ref, list(window.admitted.values()))

    def reward_of(self, ref: RolloutRef, admitted: list[Record]) -> FeedbackReward:
        """A rollout's reward from the feedback admitted to its window (the config's rules)."""
        combined = combine(admitted, self.cfg)
        value, defaulted = combined.value, False
        if value is None and self.cfg.missing == "default":
            value, defaulted = self.cfg.default, True
        return FeedbackReward(
            ref.rollout_event_id, ref.rollout_id, ref.attempt_id, ref.group_id, self.config_id, value, defaulted,
            tuple(f["event_id"] for f in sorted(admitted, key=event_order)), combined.used_ids,
            combined.superseded_ids, ref.closed_at_us + self.cfg.window_us)


def ref_to_data(ref: RolloutRef) -> Record:
    return {"rollout_event_id": ref.rollout_event_id, "rollout_id": ref.rollout_id, "attempt_id": ref.attempt_id,
            "closed_at_us": ref.closed_at_us, "call_ids": list(ref.call_ids), "session_ids": list(ref.session_ids),
            "group_id": ref.group_id}


def ref_from_data(data: Record) -> RolloutRef:
    return RolloutRef(data["rollout_event_id"], data["rollout_id"], data["attempt_id"], data["closed_at_us"],
                      tuple(data["call_ids"]), tuple(data["session_ids"]), data["group_id"])


def unmatched_reason(feedback: Record, match_wait_s: float) -> str:
    return (f"{feedback['target_kind']} {feedback['target_id']!r} named no rollout seen within "
            f"match_wait_s ({match_wait_s:g}s) of the feedback's event time")


# -- output records ---------------------------------------------------------------------------------


def reward_record(reward: FeedbackReward) -> Record:
    """The feedback reward as a Reward event (schemas/reward.avsc): ``score_ids`` name the feedback used,
    an excluded rollout is ``filtered``. Its time is the window's end, so replay writes the same event."""
    value = 0.0 if reward.reward is None else reward.reward
    components = {"source": "feedback", "admitted": list(reward.admitted_ids),
                  "superseded": list(reward.superseded_ids), "defaulted": reward.defaulted}
    return {"event_id": event_id("feedback_reward", reward.rollout_event_id, reward.config_id),
            "rollout_id": reward.rollout_id, "group_id": reward.group_id, "reward_config_id": reward.config_id,
            "score_ids": list(reward.used_ids), "raw_reward": value, "reward": value,
            "components_json": json.dumps(components, sort_keys=True, separators=(",", ":")),
            "filtered": reward.excluded, "filter_reason": "no feedback" if reward.excluded else None,
            "created_at_us": reward.window_end_us}


def unmatched_dead_letter(unmatched: UnmatchedFeedback, *, source_topic: str, partition: int, offset: int,
                          key: bytes | None, value: bytes, created_at_us: int) -> Record:
    """Unmatched feedback as a DeadLetter (the feedback itself stays on its topic, for replay)."""
    return dead_letter(stage=STAGE, source_topic=source_topic, partition=partition, offset=offset, key=key,
                       value=value, error=f"feedback {unmatched.feedback_id}: {unmatched.reason}",
                       error_type="UnmatchedFeedback", created_at_us=created_at_us)


def late_dead_letter(late: LateFeedback, *, rollout_id: str, source_topic: str, partition: int, offset: int,
                     key: bytes | None, value: bytes, created_at_us: int) -> Record:
    """Late feedback recorded as a DeadLetter of stage ``feedback_late``: the feedback stays on its topic
    and replay with a configuration that admits it uses it. One per (feedback, rollout attempt)."""
    record = dead_letter(stage=LATE_STAGE, source_topic=source_topic, partition=partition, offset=offset, key=key,
                         value=value, error=f"feedback {late.feedback_id}: late ({late.reason}) for rollout "
                         f"{rollout_id} (rollout event {late.rollout_event_id})", error_type="LateFeedback",
                         created_at_us=created_at_us)
    return dict(record, event_id=event_id("dead_letter", LATE_STAGE, late.feedback_id, late.rollout_event_id))
