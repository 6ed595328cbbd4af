"""The feedback join's second step: tokentrail.feedback-by-target -> tokentrail.feedback-by-rollout.

A table keyed by what feedback names ("call:<id>", "session:<id>") holds the rollout ids seen for it
(index messages, from the calls) and the feedback naming it that still waits (until ``match_wait_s``
after its event time). Each feedback is forwarded to every rollout its key belongs to, now or when the
key's first (or, for a session, next) call is indexed. Feedback that waited out ``match_wait_s`` without
a rollout is unmatched (a dead letter with the reason); an index is forgotten once no feedback for it
could still count (the longest wait plus ``closed_retention_s`` after its call).

Effects per input, as in the other agents: outputs sent and acknowledged, then the entry stored.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import faust
import orjson

from processors.feedback.combine import counted_time_us
from processors.feedback.config import FeedbackRewardConfig
from processors.feedback.join import UnmatchedFeedback, unmatched_reason
from processors.stream import state_budget, tables
from processors.stream.entries import due_entries, pack_entry, read_body
from processors.stream.feedback.letters import FeedbackLetters
from processors.stream.feedback.messages import Source, feedback_message, overflow_of, read_message
from processors.stream.feedback.stage import FeedbackStage
from processors.stream.health import WorkerHealth
from processors.stream.outputs import BAD_INPUT, Encoded, Outputs
from processors.stream.state_budget import StateOverflow
from processors.stream.topics import StreamTopics

Record = dict[str, Any]
STAGE = "feedback_resolver"


class FeedbackResolver(FeedbackStage):
    def __init__(self, cfg: FeedbackRewardConfig, app: faust.App, table: Any, topics: StreamTopics,
                 outputs: Outputs, letters: FeedbackLetters, health: WorkerHealth, stats: Counter[str]) -> None:
        super().__init__(cfg, app, table, topics, outputs, letters, health, stats)
        self.keep_index_us = cfg.window_us + cfg.retention_us + cfg.match_wait_us

    def _forward(self, waiting: Record, rollout_id: str, via: str) -> Encoded:
        self.stats["feedback.resolved"] += 1
        return (self.topics.feedback_by_rollout, rollout_id.encode(),
                feedback_message(waiting["feedback"], Source.of(waiting["source"]), via))

    async def resolve(self, message: Any) -> None:
        async with self.lock:
            self.stats["in.feedback_resolver"] += 1
            try:
                incoming = read_message(message.value, message.topic)
                key = message.key.decode()
                via = key.partition(":")[0]
            except (BAD_INPUT, AttributeError, UnicodeDecodeError) as exc:
                await self.outputs.dead_letter(STAGE, message, str(exc))
                return
            stored = self.table.data.get(message.key)
            entry = orjson.loads(read_body(stored)) if stored is not None else {"rollouts": [], "waiting": [],
                                                                                 "seen_us": 0}
            out: list[Encoded] = []
            if incoming["type"] == "index":
                event_us = int(incoming["event_us"])
                if incoming["rollout_id"] not in entry["rollouts"]:
                    entry["rollouts"].append(incoming["rollout_id"])
                    out += self._shed_for_index(message.key, message.partition, entry, incoming["rollout_id"])
                    for waiting in entry["waiting"]:
                        out.append(self._forward(waiting, incoming["rollout_id"], via))
                        waiting["forwarded"] = True
            elif incoming["type"] == "feedback":
                feedback = incoming["feedback"]
                event_us = counted_time_us(feedback)  # never after it was made, as in the join (agent.py)
                if any(w["feedback"]["event_id"] == feedback["event_id"] for w in entry["waiting"]):
                    return  # a re-delivery of feedback still waiting
                waiting = {"feedback": feedback, "source": incoming["source"].to_data(),
                           "expires_us": event_us + self.cfg.match_wait_us, "forwarded": bool(entry["rollouts"])}
                out += [self._forward(waiting, rollout_id, via) for rollout_id in entry["rollouts"]]
                if via == "session" or not entry["rollouts"]:  # a call has one rollout: nothing more to wait for
                    entry["waiting"].append(waiting)
            else:
                await self.outputs.dead_letter(STAGE, message, f"a {incoming['type']} message on {message.topic}")
                return
            entry["seen_us"] = max(entry["seen_us"], event_us)
            packed = self._entry(message.partition, entry)
            try:  # the target's entry within its budget, checked before anything of this input is sent
                state_budget.admit(self.table, message.key, packed, len(entry["rollouts"]) + len(entry["waiting"]))
            except StateOverflow as exc:
                await self.outputs.dead_letter(STAGE, message, overflow_of(incoming, exc))
                return
            self.clock.observe(message.partition, event_us)
            await self.outputs.send(out)
            await tables.put(self.table, message.partition, message.key, packed)

    def _shed_for_index(self, key: bytes, partition: int, entry: Record, rollout_id: str) -> list[Encoded]:
        """The rollout a call id or session belongs to is what its feedback waits for: feedback that came first
        and filled the target's entry must not keep the index out (its feedback would never reach the
        rollout). The newest feedback that has reached no rollout yet is withdrawn, one at a time, until the
        entry with the index fits its budget; each is dead-lettered StateOverflow, as it would have been had
        it come after the index. Each withdrawal takes exactly its own bytes and a comma off the entry."""
        budget = state_budget.budget_of(self.table)
        if budget is None:
            return []
        size = len(key) + len(self._entry(partition, entry))
        items = len(entry["rollouts"]) + len(entry["waiting"])
        first = f"{budget.describe(size, items)}" if budget.exceeded(size, items) else ""
        shed: list[Encoded] = []
        while budget.exceeded(size, items):
            unreached = [w for w in entry["waiting"] if not w["forwarded"]]
            if not unreached:
                break  # nothing to withdraw: the index is refused when the entry is stored
            newest = unreached[-1]
            entry["waiting"].remove(newest)
            size -= len(orjson.dumps(newest)) + (1 if entry["waiting"] else 0)
            items -= 1
            fid = newest["feedback"]["event_id"]
            shed.append(self.letters.overflow(
                newest["feedback"], Source.of(newest["source"]),
                f"feedback {fid}: withdrawn to make room for the index of rollout {rollout_id} ({first})",
                stage=STAGE))
        self.stats["feedback.shed"] += len(shed)
        return shed

    def _entry(self, partition: int, entry: Record) -> bytes:
        lag = self.cfg.lag_us
        due = min([w["expires_us"] + lag + 1 for w in entry["waiting"]]
                  + [entry["seen_us"] + self.keep_index_us + lag + 1])
        return pack_entry(partition, due, entry["seen_us"], orjson.dumps(entry))

    async def _store(self, partition: int, key: bytes, entry: Record) -> None:
        await tables.put(self.table, partition, key, self._entry(partition, entry))

    async def tick(self) -> None:
        """The timer: feedback that waited out ``match_wait_s`` stops waiting (unmatched if it never
        met a rollout); indexes nothing can use any more are forgotten."""
        if not self.health.ready():
            return
        async with self.lock:
            owned = tables.owned(self.app, self.topics.feedback_by_target)
            scanned = tables.scan(self.table, owned, self.clock)
            for key, value, partition, now in due_entries(scanned, self.clock):
                entry = orjson.loads(read_body(value))
                watermark = now - self.cfg.lag_us
                expired = [w for w in entry["waiting"] if w["expires_us"] < watermark]
                entry["waiting"] = [w for w in entry["waiting"] if w["expires_us"] >= watermark]
                out = [self.letters.unmatched(UnmatchedFeedback(w["feedback"]["event_id"], unmatched_reason(
                    w["feedback"], self.cfg.match_wait_s)), w["feedback"], Source.of(w["source"]))
                       for w in expired if not w["forwarded"]]
                await self.outputs.send(out)
                if not entry["waiting"] and entry["seen_us"] + self.keep_index_us < watermark:
                    await tables.delete(self.table, partition, key)
                    self.stats["forgot.feedback_targets"] += 1
                else:
                    await self._store(partition, key, entry)
                if not self.health.ready():
                    return
