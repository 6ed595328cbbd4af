"""Group counted, complete rollouts by an explicit group id or a configured key — never by position.

A group opens with its first rollout and closes
  * FULL when its expected size (distinct rollouts) has arrived, or
  * PARTIAL when its window has passed: ``now_us >= opened_at_us + window_us + grace_us``.
A rollout belongs to an open group only if it was created inside the window
(``created_at_us < opened_at_us + window_us``); the grace period only waits for stragglers created in
time. A rollout for a closed group (or created after its window) becomes a LATE group record of its
own: recorded, never silently dropped.

Rollouts that are INCOMPLETE or not ``counted`` are not grouped (``add`` says why): they stay on the
rollouts topic and in ClickHouse for audit, and are never scored. A group with an INCOMPLETE member
therefore closes by its window as PARTIAL unless a counted retry fills it.

Times are passed in by the caller (stream time for deterministic replays); emitted records take
their timestamps from their inputs: a FULL group its last member's ``created_at_us``, a PARTIAL
group its deadline, a LATE record its rollout's ``created_at_us``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from processors.errors import InvalidEvent
from schemas.ids import event_id

Record = dict[str, Any]

_STATE_VERSION = 1


class GroupingConfig(BaseModel):
    """How rollouts are grouped; part of the processors' deployment configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # group_key fields that define a group when no explicit group_id is given; None = all of them.
    key_fields: list[str] | None = None
    # No group_id and none of the key fields present: "task_input" groups by the task input's hash,
    # "rollout" makes the rollout a group of one.
    fallback: str = Field(default="task_input", pattern="^(task_input|rollout)$")
    window_s: float = Field(default=60.0, gt=0)
    grace_s: float = Field(default=10.0, ge=0)
    default_expected_size: int | None = Field(default=None, ge=1)
    # How long a closed group is remembered so stragglers become LATE records (not a new group).
    closed_retention_s: float = Field(default=3600.0, ge=0)

    @property
    def window_us(self) -> int:
        return round(self.window_s * 1e6)

    @property
    def grace_us(self) -> int:
        return round(self.grace_s * 1e6)


def group_key_json(rollout: Record, cfg: GroupingConfig) -> str:
    key = rollout.get("group_key") or {}
    fields = sorted(key) if cfg.key_fields is None else cfg.key_fields
    return orjson.dumps({k: key[k] for k in fields if k in key}, option=orjson.OPT_SORT_KEYS).decode()


def group_id_for(rollout: Record, cfg: GroupingConfig) -> str:
    """The group a rollout belongs to: explicit ``group_id``, else a hash of its configured key.

    The faust app keys (repartitions) rollouts by this id so one worker sees a whole group.
    """
    if rollout.get("group_id"):
        return str(rollout["group_id"])
    key_json = group_key_json(rollout, cfg)
    if key_json != "{}":
        return event_id("group_key", key_json)
    if cfg.fallback == "task_input":
        return event_id("group_task", rollout.get("task_input_json", ""))
    return event_id("group_rollout", rollout["rollout_id"])


def group_record(group_id: str, key_json: str, status: str, expected: int | None,
                 members: list[Member], created_at_us: int) -> Record:
    """A RolloutGroup record; its id is defined by the group, its status and its members.

    Members are listed by rollout id, so the record does not depend on arrival order.
    """
    members = sorted(members, key=lambda m: (m.rollout_id, m.event_id))
    rollout_event_ids = [m.event_id for m in members]
    return {"event_id": event_id("group", group_id, status, sorted(rollout_event_ids)),
            "group_id": group_id, "group_key_json": key_json, "status": status, "expected_size": expected,
            "rollout_ids": [m.rollout_id for m in members], "rollout_event_ids": rollout_event_ids,
            "created_at_us": created_at_us}


@dataclass
class Member:
    rollout_id: str
    event_id: str
    created_at_us: int
    payload: bytes | None = None  # opaque to the grouper (e.g. the encoded rollout), handed back on close


@dataclass
class Emitted:
    """A group record and the payloads of its members, in the record's order."""

    group: Record
    payloads: list[bytes | None]


@dataclass
class Added:
    emitted: list[Emitted] = field(default_factory=list)
    ignored: str | None = None  # why the rollout was not grouped (incomplete, not counted, duplicate)


@dataclass
class GroupSlot:
    """One group id's state: open with its members, or closed (remembered so stragglers are LATE).

    The unit a faust table keyed by group id stores; ``GrouperState`` holds many for replay/tests.
    """

    group_id: str
    key_json: str
    expected_size: int | None
    opened_at_us: int
    members: list[Member] = field(default_factory=list)
    closed_at_us: int | None = None

    @property
    def is_open(self) -> bool:
        return self.closed_at_us is None

    def deadline_us(self, cfg: GroupingConfig) -> int:
        return self.opened_at_us + cfg.window_us + cfg.grace_us

    def _close(self, status: str, created_at_us: int) -> Emitted:
        record = group_record(self.group_id, self.key_json, status, self.expected_size, self.members,
                              created_at_us)
        by_event = {m.event_id: m.payload for m in self.members}
        emitted = Emitted(record, [by_event[e] for e in record["rollout_event_ids"]])
        self.closed_at_us = created_at_us
        self.members = []  # closed: only the tombstone remains
        return emitted

    def close_if_due(self, now_us: int, cfg: GroupingConfig) -> Emitted | None:
        """PARTIAL record once ``now_us`` reaches window + grace after the group opened."""
        if self.is_open and now_us >= self.deadline_us(cfg):
            return self._close("PARTIAL", self.deadline_us(cfg))
        return None

    def can_forget(self, now_us: int, cfg: GroupingConfig) -> bool:
        """A closed group is forgotten after ``closed_retention_s``; later rollouts open a new one."""
        return self.closed_at_us is not None and now_us - self.closed_at_us >= round(
            cfg.closed_retention_s * 1e6)

    def to_bytes(self) -> bytes:
        members = [[m.rollout_id, m.event_id, m.created_at_us, -1 if m.payload is None else len(m.payload)]
                   for m in self.members]
        head = orjson.dumps({"v": _STATE_VERSION, "id": self.group_id, "key": self.key_json,
                             "expected": self.expected_size, "opened": self.opened_at_us,
                             "closed": self.closed_at_us, "members": members})
        return b"".join([len(head).to_bytes(4, "little"), head,
                         *(m.payload for m in self.members if m.payload is not None)])

    @classmethod
    def from_bytes(cls, data: bytes) -> GroupSlot:
        n = int.from_bytes(data[:4], "little")
        doc = orjson.loads(data[4:4 + n])
        if doc.get("v") != _STATE_VERSION:
            raise InvalidEvent(f"group state version {doc.get('v')} is not {_STATE_VERSION}")
        slot = cls(doc["id"], doc["key"], doc["expected"], int(doc["opened"]), closed_at_us=doc["closed"])
        pos = 4 + n
        for rollout_id, eid, created, size in doc["members"]:
            payload = None if size < 0 else bytes(data[pos:pos + size])
            pos += max(size, 0)
            slot.members.append(Member(rollout_id, eid, int(created), payload))
        if pos != len(data):
            raise InvalidEvent("group state has trailing or missing bytes")
        return slot


def add_rollout(slot: GroupSlot | None, rollout: Record, cfg: GroupingConfig,
                payload: bytes | None = None) -> tuple[GroupSlot | None, Added]:
    """Offer one rollout to its group's slot (None when the group id has no state yet).

    Returns the slot to store (None when nothing needs storing) and what happened.
    """
    if rollout.get("status") != "COMPLETE":
        return slot, Added(ignored="incomplete rollouts are stored, never scored")
    if not rollout.get("counted"):
        return slot, Added(ignored="attempt does not count for its rollout")
    if not rollout.get("event_id") or not rollout.get("rollout_id"):
        raise InvalidEvent("rollout without event_id or rollout_id")
    gid = group_id_for(rollout, cfg)
    if slot is not None and slot.group_id != gid:
        raise InvalidEvent(f"rollout of group {gid} offered to group {slot.group_id}")
    member = Member(rollout["rollout_id"], rollout["event_id"], int(rollout["created_at_us"]), payload)
    key_json = group_key_json(rollout, cfg)
    expected = rollout.get("expected_group_size") or cfg.default_expected_size
    if slot is not None and (not slot.is_open or member.created_at_us >= slot.opened_at_us + cfg.window_us):
        late = group_record(gid, key_json, "LATE", expected, [member], member.created_at_us)
        return slot, Added(emitted=[Emitted(late, [payload])])
    if slot is None:
        slot = GroupSlot(gid, key_json, expected, member.created_at_us)
    if any(m.event_id == member.event_id for m in slot.members):
        return slot, Added(ignored="duplicate rollout event")
    if any(m.rollout_id == member.rollout_id for m in slot.members):
        return slot, Added(ignored=f"rollout {member.rollout_id} already has a counted attempt in the group")
    slot.members.append(member)
    if slot.expected_size is None and expected:
        slot.expected_size = expected
    if slot.expected_size and len(slot.members) >= slot.expected_size:
        return slot, Added(emitted=[slot._close("FULL", max(m.created_at_us for m in slot.members))])
    return slot, Added()


@dataclass
class GrouperState:
    """Many group slots in one object: for replay, tests and single-process use."""

    slots: dict[str, GroupSlot] = field(default_factory=dict)

    def add(self, rollout: Record, cfg: GroupingConfig, payload: bytes | None = None) -> Added:
        gid = group_id_for(rollout, cfg)
        slot, added = add_rollout(self.slots.get(gid), rollout, cfg, payload)
        if slot is not None:
            self.slots[gid] = slot
        return added

    def close_due(self, now_us: int, cfg: GroupingConfig) -> list[Emitted]:
        """Close every open group whose window + grace has passed (PARTIAL); forget old closed ones."""
        out = []
        for gid in sorted(self.slots, key=lambda g: (self.slots[g].opened_at_us, g)):
            slot = self.slots[gid]
            emitted = slot.close_if_due(now_us, cfg)
            if emitted is not None:
                out.append(emitted)
            elif slot.can_forget(now_us, cfg):
                del self.slots[gid]
        return out

    def next_deadline_us(self, cfg: GroupingConfig) -> int | None:
        return min((s.deadline_us(cfg) for s in self.slots.values() if s.is_open), default=None)

    def to_bytes(self) -> bytes:
        parts = []
        for gid in sorted(self.slots):
            blob = self.slots[gid].to_bytes()
            parts += [len(blob).to_bytes(4, "little"), blob]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> GrouperState:
        state, pos = cls(), 0
        while pos < len(data):
            size = int.from_bytes(data[pos:pos + 4], "little")
            slot = GroupSlot.from_bytes(data[pos + 4:pos + 4 + size])
            state.slots[slot.group_id] = slot
            pos += 4 + size
        return state
