"""The router and grouper agents: tokentrail.rollouts -> (by group id) -> groups and what they derive.

  router   tokentrail.rollouts -> tokentrail.rollouts-by-group (internal)
           complete, counted rollouts re-keyed by group id, so one worker sees a whole group.
  grouper  tokentrail.rollouts-by-group -> groups, scores, rewards, credits, samples
           group slots in a table keyed by group id, member rollouts in a second table (so a slot
           stays small); a closed group (FULL, PARTIAL by the timer, or LATE) runs
           ``process_group`` in an executor thread (verifiers may block or run subprocesses).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from typing import Any

import faust

from processors.errors import InvalidEvent, ProcessorError
from processors.grouper import GroupSlot, add_rollout, group_id_for
from processors.isolation.calls import verifier_runner
from processors.pipeline import process_group
from processors.stream import tables
from processors.stream.clock import PartitionClocks
from processors.stream.entries import GroupEntry, due_entries, pack_entry, read_body, read_head
from processors.stream.health import WorkerHealth
from processors.stream.outputs import BAD_INPUT, Outputs, Record
from processors.stream.worker_config import StreamConfig
from schemas.codec import Codec

log = logging.getLogger("tokentrail.processors")


class Router:
    """Re-keys complete, counted rollouts by their group id onto the internal by-group topic."""

    def __init__(self, cfg: StreamConfig, codec: Codec, outputs: Outputs, stats: Counter[str]) -> None:
        self.cfg = cfg
        self.codec = codec
        self.topics = cfg.topics
        self.outputs = outputs
        self.stats = stats

    async def route(self, message: Any) -> None:
        self.stats["in.router"] += 1
        try:
            _, rollout = self.codec.decode(message.value, expect="CompletedRollout", topic=message.topic,
                                           partition=message.partition, offset=message.offset)
            if rollout["status"] != "COMPLETE" or not rollout["counted"]:
                self.stats["skipped.router.not_counted"] += 1
                return
            group_id = group_id_for(rollout, self.cfg.grouping)
        except BAD_INPUT as exc:
            await self.outputs.dead_letter("router", message, exc)
            return
        await self.outputs.send([(self.topics.by_group, group_id.encode(), message.value)])


class GrouperAgent:
    """Collects each group's rollouts (``slots`` and ``members`` tables) and derives closed groups."""

    def __init__(self, cfg: StreamConfig, app: faust.App, slots: Any, members: Any, codec: Codec,
                 outputs: Outputs, health: WorkerHealth, stats: Counter[str]) -> None:
        self.cfg = cfg
        self.app = app
        self.slots = slots
        self.members = members
        self.codec = codec
        self.topics = cfg.topics
        self.outputs = outputs
        self.health = health
        self.stats = stats
        self.lock = asyncio.Lock()  # held while a message or the timer is processed
        self.clock = PartitionClocks()

    @staticmethod
    def _member_key(group_id: str, rollout_event_id: str) -> bytes:
        return f"{group_id}\x00{rollout_event_id}".encode()

    async def group(self, message: Any) -> None:
        async with self.lock:
            self.stats["in.grouper"] += 1
            cfg = self.cfg.grouping
            try:
                _, rollout = self.codec.decode(message.value, expect="CompletedRollout", topic=message.topic,
                                               partition=message.partition, offset=message.offset)
                group_id = group_id_for(rollout, cfg)
                key = group_id.encode()
                stored = self.slots.data.get(key)
                entry = GroupEntry.from_bytes(read_body(stored)) if stored is not None else None
                if entry is not None and rollout["event_id"] in entry.done:
                    self.stats["skipped.grouper.done"] += 1  # its group's outputs are on Kafka already
                    return
                slot, added = add_rollout(entry.slot if entry else None, rollout, cfg)
            except BAD_INPUT as exc:
                await self.outputs.dead_letter("grouper", message, exc)
                return
            partition = message.partition
            created = int(rollout["created_at_us"])
            self.clock.observe(partition, created)
            member_key = self._member_key(group_id, rollout["event_id"])
            if added.ignored:
                self.stats["skipped.grouper.ignored"] += 1
                if slot is not None and slot.is_open and any(m.event_id == rollout["event_id"]
                                                             for m in slot.members):
                    # A re-delivered member: its stored copy may be the write a crash lost.
                    await tables.put(self.members, partition, member_key,
                                     pack_entry(partition, None, created, message.value))
                return
            assert slot is not None
            done = list(entry.done) if entry else []
            if not added.emitted:  # a new member of an open group: keep it until the group closes
                await tables.put(self.members, partition, member_key,
                                 pack_entry(partition, None, created, message.value))
                await self._store_slot(partition, key, GroupEntry(slot, done), created)
                return
            current = {rollout["event_id"]: rollout}
            for emitted in added.emitted:
                await self._close_group(emitted.group, current, message)
                done += emitted.group["rollout_event_ids"]
            await self._store_slot(partition, key, GroupEntry(slot, done), created)
            await self._drop_members(partition, group_id, [e.group for e in added.emitted])

    def _stored_members(self, group: Record, known: dict[str, Record]) -> list[Record]:
        rollouts = []
        for event_id in group["rollout_event_ids"]:
            if event_id in known:
                rollouts.append(known[event_id])
                continue
            stored = self.members.data.get(self._member_key(group["group_id"], event_id))
            if stored is None:
                raise InvalidEvent(f"group {group['event_id']}: member rollout {event_id} is not in the "
                                   "grouper's member table")
            rollouts.append(self.codec.decode(read_body(stored), expect="CompletedRollout")[1])
        return rollouts

    async def _close_group(self, group: Record, known: dict[str, Record], source: Any | None) -> None:
        """Run the stage pipeline for a closed group and produce everything it derives.

        The group record is produced even when its derivation fails (the failure is dead-lettered
        against the input that closed it, or logged when the timer closed it)."""
        outputs = self.outputs.encode([("RolloutGroup", group)])
        self.stats[f"groups.{group['status']}"] += 1
        try:
            rollouts = self._stored_members(group, known)
            call = functools.partial(process_group, group, rollouts, list(self.cfg.verifiers),
                                     self.cfg.stages.reward, self.cfg.stages.credit, self.cfg.stages.sample,
                                     runner=verifier_runner())
            derived = await asyncio.get_running_loop().run_in_executor(None, call)
            outputs += self.outputs.encode(derived.events())
        except ProcessorError as exc:
            if source is not None:
                await self.outputs.dead_letter("grouper", source, f"group {group['event_id']}: {exc}")
            else:
                log.error("group %s (%s) could not be derived: %s", group["event_id"], group["status"], exc)
                self.stats["failed.groups"] += 1
        await self.outputs.send(outputs)

    async def _store_slot(self, partition: int, key: bytes, entry: GroupEntry, event_us: int) -> None:
        slot, cfg = entry.slot, self.cfg.grouping
        if slot.is_open:
            due = slot.deadline_us(cfg)
        else:
            assert slot.closed_at_us is not None
            due = slot.closed_at_us + round(cfg.closed_retention_s * 1e6)
        await tables.put(self.slots, partition, key, pack_entry(partition, due, event_us, entry.to_bytes()))

    async def _drop_members(self, partition: int, group_id: str, groups: list[Record]) -> None:
        for group in groups:
            for event_id in group["rollout_event_ids"]:
                member_key = self._member_key(group_id, event_id)
                if member_key in self.members.data:
                    await tables.delete(self.members, partition, member_key)

    async def tick(self) -> None:
        """The timer: close groups whose window (or grace) ran out (PARTIAL) and forget old slots."""
        if not self.health.ready():
            return
        cfg = self.cfg.grouping
        async with self.lock:
            owned = tables.owned(self.app, self.topics.by_group)
            scanned = tables.scan(self.slots, owned, self.clock)
            for key, value, partition, now in due_entries(scanned, self.clock):
                entry = GroupEntry.from_bytes(read_body(value))
                emitted = entry.slot.close_if_due(now, cfg)
                if emitted is not None:
                    await self._close_group(emitted.group, {}, None)
                    entry.done += emitted.group["rollout_event_ids"]
                    await self._store_slot(partition, key, entry, emitted.group["created_at_us"])
                    await self._drop_members(partition, entry.slot.group_id, [emitted.group])
                elif entry.slot.can_forget(now, cfg):
                    await tables.delete(self.slots, partition, key)
                    self.stats["forgot.groups"] += 1
                if not self.health.ready():
                    return
            await self._drop_orphan_members(owned)

    async def _drop_orphan_members(self, owned: set[int]) -> None:
        """Member copies whose group no longer holds them open (left by a crash between writes)."""
        slots: dict[str, GroupSlot | None] = {}
        for key, value in tables.scan(self.members, owned, PartitionClocks()):
            group_id, _, event_id = key.decode().partition("\x00")
            if group_id not in slots:
                stored = self.slots.data.get(group_id.encode())
                slots[group_id] = GroupEntry.from_bytes(read_body(stored)).slot if stored is not None else None
            slot = slots[group_id]
            if slot is None or not slot.is_open or all(m.event_id != event_id for m in slot.members):
                await tables.delete(self.members, read_head(value).partition, key)
                self.stats["dropped.orphan_members"] += 1
