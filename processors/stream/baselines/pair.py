"""The baselines' first stateful step: tokentrail.baseline-by-rollout -> tokentrail.baseline-by-key.

Per rollout id (table ``baseline-pairs``) it holds each completed attempt (its Avro bytes), the cluster key
of its first call (when the key is by first user message) and the feedback rewards not yet paired. An
attempt with its reward (``reward_of_attempt``) and its key becomes a member, sent keyed by its grouping key;
its bytes are then dropped and the pairing remembered, so re-deliveries change nothing. An entry is forgotten
``retention_us`` after the newest event time it saw (stream time, clock.py), paired or not.

Effects per input, as in the other agents: outputs sent and acknowledged, then the entry stored.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import faust

from processors.baselines.config import BaselineConfig
from processors.baselines.keys import rollout_key
from processors.baselines.members import member_of, reward_of_attempt
from processors.stream import tables
from processors.stream.baselines.messages import FIRST, ROLLOUT, pack, read_tagged, unpack
from processors.stream.clock import PartitionClocks
from processors.stream.entries import due_entries, pack_entry, read_body
from processors.stream.health import WorkerHealth
from processors.stream.outputs import BAD_INPUT, Encoded, Outputs
from processors.stream.topics import StreamTopics
from schemas.codec import Codec

Record = dict[str, Any]
STAGE = "baseline_pair"


class BaselinePairs:
    def __init__(self, cfg: BaselineConfig, app: faust.App, table: Any, topics: StreamTopics, codec: Codec,
                 outputs: Outputs, health: WorkerHealth, stats: Counter[str], retention_us: int) -> None:
        self.cfg = cfg
        self.app = app
        self.table = table
        self.topics = topics
        self.codec = codec
        self.outputs = outputs
        self.health = health
        self.stats = stats
        self.retention_us = retention_us
        self.lock = asyncio.Lock()
        self.clock = PartitionClocks()

    @staticmethod
    def _load(stored: bytes | None) -> tuple[Record, dict[str, bytes]]:
        if stored is None:
            return {"attempts": {}, "rewards": [], "paired": [], "seen_us": 0}, {}
        head, blobs = unpack(read_body(stored))
        with_bytes = [aid for aid in sorted(head["attempts"]) if head["attempts"][aid].get("held")]
        return head, dict(zip(with_bytes, blobs, strict=True))

    async def pair(self, message: Any) -> None:
        async with self.lock:
            self.stats["in.baseline_pair"] += 1
            try:
                tag, body = read_tagged(message.value, message.topic)
                rollout = None
                if tag == ROLLOUT:
                    _, rollout = self.codec.decode(body, expect="CompletedRollout", topic=message.topic,
                                                   partition=message.partition, offset=message.offset)
            except BAD_INPUT as exc:
                await self.outputs.dead_letter(STAGE, message, exc)
                return
            entry, held = self._load(self.table.data.get(message.key))
            event_us = entry["seen_us"]
            if tag == FIRST:
                attempt = entry["attempts"].setdefault(body["attempt_id"], {})
                attempt.update(first_key=body["key"], has_key=True)
                event_us = max(event_us, int(body["event_us"]))
            elif rollout is not None:
                attempt = entry["attempts"].setdefault(rollout["attempt_id"], {})
                if not attempt.get("paired"):
                    attempt.update(event_id=rollout["event_id"], rollout_id=rollout["rollout_id"],
                                   created_at_us=int(rollout["created_at_us"]), held=True)
                    if self.cfg.key.by == "field" or not rollout["calls"]:
                        attempt.update(has_key=True, first_key=attempt.get("first_key"))
                    if self.cfg.key.by == "field":
                        attempt["field_key"] = rollout_key(rollout, self.cfg.key)
                    held[rollout["attempt_id"]] = body
                event_us = max(event_us, int(rollout["created_at_us"]))
            else:
                if body["event_id"] not in entry["paired"] and all(
                        r["event_id"] != body["event_id"] for r in entry["rewards"]):
                    entry["rewards"].append(body)
                event_us = max(event_us, int(body["created_at_us"]))
            entry["seen_us"] = event_us
            self.clock.observe(message.partition, event_us)
            out = self._paired(entry, held)
            await self.outputs.send(out)
            await self._store(message.partition, message.key, entry, held)

    def _paired(self, entry: Record, held: dict[str, bytes]) -> list[Encoded]:
        out: list[Encoded] = []
        for aid in sorted(entry["attempts"]):
            attempt = entry["attempts"][aid]
            if attempt.get("paired") or not attempt.get("held") or not attempt.get("has_key"):
                continue
            reward = next((r for r in entry["rewards"] if reward_of_attempt(r, attempt["event_id"])), None)
            if reward is None:
                continue
            rollout_head = {"event_id": attempt["event_id"], "rollout_id": attempt["rollout_id"],
                            "created_at_us": attempt["created_at_us"]}
            if self.cfg.key.by == "field":
                key = attempt.get("field_key")
            else:
                key = rollout_key({}, self.cfg.key, attempt.get("first_key"))
            if key is not None:
                member = member_of(rollout_head, reward)
                out.append((self.topics.baseline_by_key, key.encode(),
                            pack({"key": key, "member": member.to_data(), "reward": reward}, [held[aid]])))
                self.stats["baseline.paired"] += 1
            else:
                self.stats["skipped.baseline_pair.no_key"] += 1
            attempt.update(paired=True, held=False)
            held.pop(aid, None)
            entry["rewards"].remove(reward)
            entry["paired"].append(reward["event_id"])
        return out

    async def _store(self, partition: int, key: bytes, entry: Record, held: dict[str, bytes]) -> None:
        blobs = [held[aid] for aid in sorted(entry["attempts"]) if entry["attempts"][aid].get("held")]
        due = entry["seen_us"] + self.retention_us
        await tables.put(self.table, partition, key, pack_entry(partition, due, entry["seen_us"], pack(entry, blobs)))

    async def tick(self) -> None:
        """The timer: entries whose newest event is ``retention_us`` behind stream time are forgotten."""
        if not self.health.ready():
            return
        async with self.lock:
            owned = tables.owned(self.app, self.topics.baseline_by_rollout)
            scanned = tables.scan(self.table, owned, self.clock)
            for due in due_entries(scanned, self.clock):
                await tables.delete(self.table, due.partition, due.key)
                self.stats["forgot.baseline_pairs"] += 1
                if not self.health.ready():
                    return
