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

from typing import Any

import orjson

from processors.feedback.join import (
    FeedbackJoin,
    FeedbackReward,
    LateFeedback,
    Output,
    UnmatchedFeedback,
    reward_record,
)
from processors.stream import tables
from processors.stream.entries import due_entries, pack_entry, read_body
from processors.stream.feedback.messages import Source, read_message
from processors.stream.feedback.stage import FeedbackStage
from processors.stream.outputs import BAD_INPUT, Encoded

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

    def to_bytes(self) -> bytes:
        # Only feedback the join still holds (waiting or admitted to an open window) can be reported on later.
        live = set(self.join.pending) | {fid for w in self.join.open.values() for fid in w.admitted}
        self.held = {fid: v for fid, v in self.held.items() if fid in live}
        self.used = {rid: ids for rid, ids in self.used.items() if rid in self.join.closed}
        return orjson.dumps({"join": self.join.snapshot(), "held": self.held, "used": self.used})


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
            state = self._load(self.table.data.get(message.key))
            if incoming["type"] == "rollout":
                event_us = incoming["ref"].closed_at_us
                produced = state.join.add_rollout(incoming["ref"])
            elif incoming["type"] == "feedback":
                feedback = incoming["feedback"]
                if incoming["via"] == "session":  # joined as naming the rollout (module docstring)
                    feedback = dict(feedback, target_kind="ROLLOUT", target_id=rollout_id, call_id=None)
                state.held[feedback["event_id"]] = [incoming["feedback"], incoming["source"].to_data()]
                event_us = int(feedback["event_time_us"])
                produced = state.join.add_feedback(feedback)
            else:
                await self.outputs.dead_letter(STAGE, message, f"a {incoming['type']} message on {message.topic}")
                return
            self.clock.observe(message.partition, event_us)
            await self.outputs.send(self._encode(produced, state, rollout_id))
            await self._store(message.partition, message.key, state)

    def _encode(self, produced: list[Output], state: _State, rollout_id: str) -> list[Encoded]:
        out: list[Encoded] = []
        for item in produced:
            if isinstance(item, FeedbackReward):
                out += self.outputs.encode([("Reward", reward_record(item))])
                state.used[item.rollout_event_id] = list(item.admitted_ids)
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

    async def _store(self, partition: int, key: bytes, state: _State) -> None:
        due = state.join.next_due_us()
        if due is None:
            await tables.delete(self.table, partition, key)
            return
        event_us = state.join.max_event_us or 0
        await tables.put(self.table, partition, key, pack_entry(partition, due, event_us, state.to_bytes()))

    async def tick(self) -> None:
        """The timer: tick every due join with its partition's stream time (windows close, waits end)."""
        if not self.health.ready():
            return
        async with self.lock:
            owned = tables.owned(self.app, self.topics.feedback_by_rollout)
            scanned = tables.scan(self.table, owned, self.clock)
            for key, value, partition, now in due_entries(scanned, self.clock):
                state = self._load(value)
                await self.outputs.send(self._encode(state.join.tick(now), state, key.decode()))
                await self._store(partition, key, state)
                if not self.health.ready():
                    return
