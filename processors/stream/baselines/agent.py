"""The baselines' second step: tokentrail.baseline-by-key -> Baseline, Reward, Credit and Sample events.

One ``KeyBaselines`` (processors/baselines/windows.py, pure) per grouping key, kept in the changelogged
table ``baseline-keys`` as its snapshot plus the members it still holds (their feedback reward and rollout
bytes), so a restarted worker resumes. A member moves the key's watermark; the timer ticks every due key
with the partition's stream time (clock.py), so a quiet key's windows still close. Each closed window goes
through ``derive_window`` (the Baseline event, then rewards, credits and samples measured against it); a
member whose window had already closed is a dead letter of stage ``baseline_late`` (its message's bytes,
so replay or an operator can use it).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import faust

from processors.baselines.config import BaselineConfig
from processors.baselines.derive import derive_window
from processors.baselines.windows import BaselineWindow, KeyBaselines, LateMember, Member, Output
from processors.credit import CreditConfig
from processors.samples import SampleConfig
from processors.stream import tables
from processors.stream.baselines.messages import pack, unpack
from processors.stream.clock import PartitionClocks
from processors.stream.entries import due_entries, pack_entry, read_body
from processors.stream.health import WorkerHealth
from processors.stream.outputs import BAD_INPUT, Encoded, Outputs
from processors.stream.topics import StreamTopics
from schemas.codec import Codec

Record = dict[str, Any]
log = logging.getLogger("tokentrail.processors")
STAGE = "baseline"
LATE_STAGE = "baseline_late"


class _State:
    def __init__(self, baselines: KeyBaselines, held: dict[str, tuple[Record, bytes]]) -> None:
        self.baselines = baselines
        self.held = held  # rollout event id -> (feedback reward, rollout bytes), for members still pending

    def to_bytes(self) -> bytes:
        self.held = {rid: v for rid, v in self.held.items() if rid in self.baselines.pending}
        order = sorted(self.held)
        return pack({"state": self.baselines.snapshot(), "held": [[rid, self.held[rid][0]] for rid in order]},
                    [self.held[rid][1] for rid in order])


class BaselineKeys:
    def __init__(self, cfg: BaselineConfig, credit: CreditConfig, sample: SampleConfig, app: faust.App, table: Any,
                 topics: StreamTopics, codec: Codec, outputs: Outputs, health: WorkerHealth,
                 stats: Counter[str]) -> None:
        self.cfg = cfg
        self.credit = credit
        self.sample = sample
        self.app = app
        self.table = table
        self.topics = topics
        self.codec = codec
        self.outputs = outputs
        self.health = health
        self.stats = stats
        self.lock = asyncio.Lock()
        self.clock = PartitionClocks()

    def _load(self, key: str, stored: bytes | None) -> _State:
        if stored is None:
            return _State(KeyBaselines(self.cfg, key), {})
        head, blobs = unpack(read_body(stored))
        held = {rid: (reward, blob) for (rid, reward), blob in zip(head["held"], blobs, strict=True)}
        return _State(KeyBaselines.restore(self.cfg, head["state"]), held)

    async def measure(self, message: Any) -> None:
        async with self.lock:
            self.stats["in.baseline"] += 1
            try:
                head, blobs = unpack(message.value)
                key, member, reward = str(head["key"]), Member.of(head["member"]), head["reward"]
                if len(blobs) != 1 or key != message.key.decode():
                    raise ValueError("a member message holds one rollout and is keyed by its grouping key")
            except (*BAD_INPUT, KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError) as exc:
                await self.outputs.dead_letter(STAGE, message, str(exc))
                return
            state = self._load(key, self.table.data.get(message.key))
            produced = state.baselines.add(member)
            if member.rollout_event_id in state.baselines.pending:
                state.held.setdefault(member.rollout_event_id, (reward, blobs[0]))
            self.clock.observe(message.partition, member.event_us)
            try:
                out = self._encode(produced, state)
            except BAD_INPUT as exc:  # a window whose inputs cannot be derived: recorded, the key goes on
                await self.outputs.dead_letter(STAGE, message, exc)
                out = []
            for item in produced:
                if isinstance(item, LateMember):
                    await self.outputs.dead_letter(LATE_STAGE, message, (
                        f"rollout {item.member.rollout_id} (attempt event {item.member.rollout_event_id}) of key "
                        f"{item.key!r}: its baseline window had closed ({item.reason}); not measured"))
                    self.stats["baseline.late"] += 1
            await self.outputs.send(out)
            await self._store(message.partition, message.key, state)

    def _encode(self, produced: list[Output], state: _State) -> list[Encoded]:
        out: list[Encoded] = []
        for window in produced:
            if not isinstance(window, BaselineWindow):
                continue
            rollouts, rewards = {}, {}
            for m in window.members:
                reward, blob = state.held[m.rollout_event_id]
                rollouts[m.rollout_event_id] = self.codec.decode(blob, expect="CompletedRollout")[1]
                rewards[m.reward_id] = reward
            out += self.outputs.encode(derive_window(window, rollouts, rewards, self.credit, self.sample,
                                                     skip_zero=self.cfg.skip_zero_advantage))
            self.stats[f"baseline.windows.{window.method.lower()}"] += 1
        return out

    async def _store(self, partition: int, key: bytes, state: _State) -> None:
        if state.baselines.empty and state.baselines.running.count == 0:
            await tables.delete(self.table, partition, key)
            return
        # The running baseline is the key's memory: the entry stays (due None) once nothing is pending.
        await tables.put(self.table, partition, key, pack_entry(partition, state.baselines.next_due_us(),
                                                                state.baselines.max_event_us or 0, state.to_bytes()))

    async def tick(self) -> None:
        """The timer: tick every due key with its partition's stream time (windows close)."""
        if not self.health.ready():
            return
        async with self.lock:
            owned = tables.owned(self.app, self.topics.baseline_by_key)
            scanned = tables.scan(self.table, owned, self.clock)
            for key, value, partition, now in due_entries(scanned, self.clock):
                state = self._load(key.decode(), value)
                try:
                    out = self._encode(state.baselines.tick(now), state)
                except BAD_INPUT as exc:  # no input message to dead-letter: logged and counted, the key goes on
                    log.error("baseline windows of key %r could not be derived: %s", key.decode(), exc)
                    self.stats["baseline.underived"] += 1
                    out = []
                await self.outputs.send(out)
                await self._store(partition, key, state)
                if not self.health.ready():
                    return
