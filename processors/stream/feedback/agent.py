"""The feedback join's last step: tokentrail.feedback-by-rollout -> rewards, late and unmatched feedback.

One ``FeedbackJoin`` (processors/feedback/join.py, pure) per rollout id, kept in the changelogged table
``feedback-join`` as its snapshot plus the feedback it still holds (with where each sits on
tokentrail.feedback), so a restarted worker resumes. Its inputs are the rollout's completed attempts and
the feedback resolved to it; its watermark advances with them and with the timer, which ticks every due
entry with the partition's stream time (the newest event time seen there plus the wall time since,
clock.py), so an idle partition still closes its windows.

Outputs: each closed window's reward as a ``Reward`` on tokentrail.rewards (``reward_record``: its own
``reward_config_id``, ``score_ids`` the feedback used, ``components_json`` with ``"source": "feedback"``);
late feedback as a dead letter of stage ``feedback_late``; feedback whose rollout never completed within
``match_wait_s`` as a dead letter of stage ``feedback_join`` (``UnmatchedFeedback``).

Feedback that named a session reaches the rollout through that session's calls; it is joined as naming
the rollout (every attempt of it), since a completed rollout does not carry its calls' session ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from processors.feedback.combine import counted_time_us
from processors.feedback.join import (
    FeedbackJoin,
    FeedbackReward,
    LateFeedback,
    Output,
    UnmatchedFeedback,
    reward_record,
)
from processors.stream import state_budget, tables
from processors.stream.entries import due_entries, pack_entry, read_body
from processors.stream.feedback.messages import Source, overflow_of, read_message
from processors.stream.feedback.stage import FeedbackStage
from processors.stream.outputs import BAD_INPUT, Encoded
from processors.stream.state_budget import StateOverflow

Record = dict[str, Any]
STAGE = "feedback_join"


class _State:
    """A rollout id's join, the feedback records it may still report on (id -> feedback, source), and what
    each closed window admitted (rollout event id -> feedback ids), so that feedback re-delivered after a
    crash once its window closed is known as used, not recorded as late."""

    def __init__(self, join: FeedbackJoin, held: dict[str, list[Any]], used: dict[str, list[str]]) -> None:
        self.join = join
        self.held = held
        self.used = used

    def live_held(self) -> dict[str, list[Any]]:
        """The held feedback the join can still report on (waiting, or admitted to an open window)."""
        live = set(self.join.pending) | {fid for w in self.join.open.values() for fid in w.admitted}
        return {fid: v for fid, v in self.held.items() if fid in live}

    def to_bytes(self) -> bytes:
        used = {rid: ids for rid, ids in self.used.items() if rid in self.join.closed}
        return orjson.dumps({"join": self.join.snapshot(), "held": self.live_held(), "used": used})

    def items(self) -> int:
        """What the entry holds, for its budget: the feedback held and the rollout attempts known."""
        return len(self.live_held()) + len(self.join.open) + len(self.join.closed)

    def mark_used(self, produced: list[Output]) -> None:
        """Remember what each reward produced here admitted (its entry keeps it while the attempt is known)."""
        for item in produced:
            if isinstance(item, FeedbackReward):
                self.used[item.rollout_event_id] = list(item.admitted_ids)


@dataclass
class _Folded:
    """One input folded into a rollout's join: the state after it, its outputs, the entry to store (None:
    delete), the stream time it moves the partition's clock to, letters for feedback shed to fit it, and how
    much feedback waited unmatched before it."""

    state: _State
    produced: list[Output]
    entry: bytes | None
    event_us: int
    shed: list[tuple[str, Record, Source]]  # feedback id, the feedback, where it sits on tokentrail.feedback
    waiting: int  # feedback that waited for a rollout and had met none, before this input


class FeedbackJoinAgent(FeedbackStage):
    def _load(self, stored: bytes | None) -> _State:
        if stored is None:
            return _State(FeedbackJoin(self.cfg), {}, {})
        data = orjson.loads(read_body(stored))
        return _State(FeedbackJoin.restore(self.cfg, data["join"]), data["held"], data["used"])

    async def join(self, message: Any) -> None:
        async with self.lock:
            self.stats["in.feedback_join"] += 1
            try:
                incoming = read_message(message.value, message.topic)
                rollout_id = message.key.decode()
            except (BAD_INPUT, AttributeError, UnicodeDecodeError) as exc:
                await self.outputs.dead_letter(STAGE, message, str(exc))
                return
            if incoming["type"] not in ("rollout", "feedback"):
                await self.outputs.dead_letter(STAGE, message, f"a {incoming['type']} message on {message.topic}")
                return
            stored = self.table.data.get(message.key)
            folded = self._fold(stored, incoming, rollout_id, message.partition)
            overflow, why = self._overflow(message.key, folded), ""
            if incoming["type"] == "rollout" and overflow is not None:
                why = (f"withdrawn to make room for rollout {rollout_id}'s completed attempt "
                       f"{incoming['ref'].attempt_id} ({overflow})")
                folded = self._shed_for_rollout(stored, incoming, rollout_id, message.partition, folded)
                overflow = self._overflow(message.key, folded)
            if overflow is not None:  # the entry within its budget, checked before anything of this input is sent
                await self.outputs.dead_letter(STAGE, message, overflow_of(incoming, overflow))
                return
            self.clock.observe(message.partition, folded.event_us)
            letters = [self.letters.overflow(feedback, source, f"feedback {fid}: {why}")
                       for fid, feedback, source in folded.shed]
            self.stats["feedback.shed"] += len(letters)
            await self.outputs.send(letters + self._encode(folded.produced, folded.state, rollout_id))
            await self._write(message.partition, message.key, folded.entry)

    def _fold(self, stored: bytes | None, incoming: Record, rollout_id: str, partition: int, shed: int = 0
              ) -> _Folded:
        """The rollout's join with ``incoming`` folded in: what it produced and its new entry (nothing sent or
        counted yet). ``shed``: for a rollout, first withdraw that many of the newest feedback waiting for it."""
        state = self._load(stored)
        withdrawn: list[tuple[str, Record, Source]] = []
        waiting = len(state.join.waiting_unmatched())
        if incoming["type"] == "rollout":
            for fid in state.join.waiting_unmatched()[::-1][:shed]:
                state.join.withdraw(fid)
                feedback, source = state.held.pop(fid)
                withdrawn.append((fid, feedback, Source.of(source)))
            event_us = incoming["ref"].closed_at_us
            produced = state.join.add_rollout(incoming["ref"])
        else:
            feedback = incoming["feedback"]
            if incoming["via"] == "session":  # joined as naming the rollout (module docstring)
                feedback = dict(feedback, target_kind="ROLLOUT", target_id=rollout_id, call_id=None)
            state.held[feedback["event_id"]] = [incoming["feedback"], incoming["source"].to_data()]
            # Its stream time is when it counts (never after it was made), as in the join itself: an event time
            # claimed ahead would otherwise move the partition's clock and close other rollouts' windows early.
            event_us = counted_time_us(feedback)
            produced = state.join.add_feedback(feedback)
        state.mark_used(produced)
        return _Folded(state, produced, self._entry(partition, state), event_us, withdrawn, waiting)

    def _overflow(self, key: bytes, folded: _Folded) -> StateOverflow | None:
        try:
            state_budget.admit(self.table, key, folded.entry or b"", folded.state.items())
        except StateOverflow as exc:
            return exc
        return None

    def _shed_for_rollout(self, stored: bytes | None, incoming: Record, rollout_id: str, partition: int,
                          folded: _Folded) -> _Folded:
        """A completed attempt is what the join is for: feedback that arrived before it and filled the rollout's
        entry must not keep it out (the attempt would get no reward, and that feedback would end unmatched).
        The fewest of the newest feedback still waiting are withdrawn that let the entry with the attempt fit,
        each dead-lettered as StateOverflow, as it would have been had it arrived after the attempt; the
        attempt is refused only when it does not fit even without them. Sizes shrink with every feedback
        withdrawn, so the fewest is found by bisection."""
        key, waiting = rollout_id.encode(), folded.waiting
        most = self._fold(stored, incoming, rollout_id, partition, shed=waiting)
        if waiting == 0 or self._overflow(key, most) is not None:
            return folded
        low, high = 0, waiting  # low does not fit, high does
        fits = most
        while high - low > 1:
            middle = (low + high) // 2
            candidate = self._fold(stored, incoming, rollout_id, partition, shed=middle)
            if self._overflow(key, candidate) is None:
                high, fits = middle, candidate
            else:
                low = middle
        self.stats["feedback.shed_for_rollout"] += 1
        return fits

    def _encode(self, produced: list[Output], state: _State, rollout_id: str) -> list[Encoded]:
        out: list[Encoded] = []
        for item in produced:
            if isinstance(item, FeedbackReward):
                out += self.outputs.encode([("Reward", reward_record(item))])
                self.stats["feedback.rewards"] += 1
                continue
            feedback, source = state.held[item.feedback_id]
            if isinstance(item, LateFeedback) and item.feedback_id in state.used.get(item.rollout_event_id, ()):
                self.stats["skipped.feedback_join.redelivered"] += 1  # used by that window's reward already
                continue
            if isinstance(item, LateFeedback):
                out.append(self.letters.late(item, rollout_id, feedback, Source.of(source)))
            else:
                assert isinstance(item, UnmatchedFeedback)
                reason = (f"{feedback['target_kind']} {feedback['target_id']!r} (rollout {rollout_id!r}): no "
                          f"completed attempt of the rollout within match_wait_s ({self.cfg.match_wait_s:g}s) of "
                          "the feedback's event time")
                out.append(self.letters.unmatched(UnmatchedFeedback(item.feedback_id, reason), feedback,
                                                  Source.of(source)))
        return out

    @staticmethod
    def _entry(partition: int, state: _State) -> bytes | None:
        """The table entry of ``state``; None when it holds nothing more (the key is deleted)."""
        due = state.join.next_due_us()
        if due is None:
            return None
        return pack_entry(partition, due, state.join.max_event_us or 0, state.to_bytes())

    async def _write(self, partition: int, key: bytes, entry: bytes | None) -> None:
        if entry is None:
            await tables.delete(self.table, partition, key)
        else:
            await tables.put(self.table, partition, key, entry)

    async def _store(self, partition: int, key: bytes, state: _State) -> None:
        await self._write(partition, key, self._entry(partition, state))

    async def tick(self) -> None:
        """The timer: tick every due join with its partition's stream time (windows close, waits end)."""
        if not self.health.ready():
            return
        async with self.lock:
            owned = tables.owned(self.app, self.topics.feedback_by_rollout)
            scanned = tables.scan(self.table, owned, self.clock)
            for key, value, partition, now in due_entries(scanned, self.clock):
                state = self._load(value)
                produced = state.join.tick(now)
                state.mark_used(produced)
                await self.outputs.send(self._encode(produced, state, key.decode()))
                await self._store(partition, key, state)
                if not self.health.ready():
                    return
