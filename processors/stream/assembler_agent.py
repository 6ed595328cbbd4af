"""The assembler agent: tokentrail.calls + tokentrail.env -> tokentrail.rollouts.

faust has no stream-stream join (Join.process is unimplemented), so one agent consumes both topics.
They are keyed by rollout id with the same partition count, hence co-partitioned; the join state is a
table keyed by rollout id holding ``RolloutAssembly.to_bytes()``. A timer expires attempts idle for
settings.processors.attempt_timeout_s (INCOMPLETE rollouts) and forgets old state.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import faust

from processors.assembler import RolloutAssembly
from processors.errors import InvalidEvent
from processors.stream import tables
from processors.stream.clock import PartitionClocks
from processors.stream.entries import due_entries, pack_entry, read_body
from processors.stream.health import WorkerHealth
from processors.stream.outputs import BAD_INPUT, Outputs
from processors.stream.worker_config import StreamConfig
from schemas.codec import Codec

log = logging.getLogger("tokentrail.processors")

ENV_NAMES = ("AttemptStarted", "EnvStep", "AttemptFinished")

class AssemblerAgent:
    """Joins each rollout's calls and environment events in the ``assembly`` table."""

    def __init__(self, cfg: StreamConfig, app: faust.App, assembly: Any, codec: Codec, outputs: Outputs,
                 health: WorkerHealth, stats: Counter[str]) -> None:
        self.app = app
        self.assembly = assembly
        self.codec = codec
        self.topics = cfg.topics
        self.outputs = outputs
        self.health = health
        self.stats = stats
        self.timeout_us = round(cfg.processors.attempt_timeout_s * 1e6)
        self.max_rollout_bytes = cfg.max_rollout_bytes
        self.retention_us = round(cfg.state_retention_s * 1e6)
        self.lock = asyncio.Lock()  # held while a message or the timer is processed
        self.clock = PartitionClocks()

    async def assemble(self, message: Any) -> None:
        async with self.lock:
            self.stats["in.assembler"] += 1
            expect: str | tuple[str, ...] = "CallRecord" if message.topic == self.topics.calls else ENV_NAMES
            try:
                name, record = self.codec.decode(message.value, expect=expect, topic=message.topic,
                                                 partition=message.partition, offset=message.offset)
                rollout_id = record.get("rollout_id")
                if not rollout_id:
                    raise InvalidEvent(f"{name} {record.get('event_id')} has no rollout_id")
                if message.key != rollout_id.encode():
                    raise InvalidEvent(f"{name} {record.get('event_id')} has key {message.key!r}, not its "
                                       f"rollout id {rollout_id!r}: a rollout's events must share a partition")
                key = rollout_id.encode()
                stored = self.assembly.data.get(key)
                state = (RolloutAssembly.from_bytes(read_body(stored)) if stored is not None
                         else RolloutAssembly(rollout_id))
                accepted = state.accept(name, record, self.max_rollout_bytes)
                outputs = self.outputs.encode([("CompletedRollout", r) for r in accepted.rollouts])
            except BAD_INPUT as exc:
                await self.outputs.dead_letter("assembler", message, exc)
                return
            if accepted.duplicate or accepted.late:
                # Late: the attempt was emitted, and its rollout was acknowledged before that was stored.
                self.stats["skipped.assembler." + ("duplicate" if accepted.duplicate else "late")] += 1
                return
            self.clock.observe(message.partition, state.last_event_us)
            await self.outputs.send(outputs)
            await self._store(message.partition, key, state)

    async def _store(self, partition: int, key: bytes, state: RolloutAssembly) -> None:
        deadline = state.next_deadline_us(self.timeout_us)
        due = deadline if deadline is not None else state.last_event_us + self.retention_us
        await tables.put(self.assembly, partition, key,
                         pack_entry(partition, due, state.last_event_us, state.to_bytes()))

    async def tick(self) -> None:
        """The timer: expire idle attempts (INCOMPLETE rollouts) and forget old state."""
        if not self.health.ready():
            return
        async with self.lock:
            owned = tables.owned(self.app, self.topics.calls)
            scanned = tables.scan(self.assembly, owned, self.clock)
            for key, value, partition, now in due_entries(scanned, self.clock):
                state = RolloutAssembly.from_bytes(read_body(value))
                expired = state.expire_due(now, self.timeout_us)
                try:
                    outputs = self.outputs.encode([("CompletedRollout", r) for r in expired])
                except InvalidEvent:
                    log.exception("expired rollouts of %s cannot be encoded; dropping them", key)
                    outputs = []
                await self.outputs.send(outputs)
                self.stats["expired.attempts"] += len(expired)
                if state.can_forget(now, self.retention_us):
                    await tables.delete(self.assembly, partition, key)
                    self.stats["forgot.rollouts"] += 1
                else:
                    await self._store(partition, key, state)
                if not self.health.ready():
                    return
