"""Table values of the processors app: a small fixed header in front of the core's state bytes.

    partition (u32) | due_us (i64, -1 = never) | event_us (i64) | body

``partition`` is the input partition the key lives in (the timers write changelog entries outside
any event, so they must know it); ``due_us`` is when the timer has to look at the key again (an
attempt's expiry, a group's window end, or when the state may be forgotten); ``event_us`` is the
newest event time in the state, to seed a partition's stream clock after a restart. The timers scan
headers only, never the state itself: ``due_entries`` picks the entries whose time has come.

Group entries carry, before the GroupSlot bytes, the rollout event ids that have already been
emitted in a group record for that group id (FULL, PARTIAL or LATE): a re-delivered rollout found
there was fully processed before the marker was stored, so it is skipped.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import orjson

from processors.grouper import GroupSlot
from processors.stream.clock import PartitionClocks

_HEAD = struct.Struct("<Iqq")
NEVER = -1


@dataclass(frozen=True)
class EntryHead:
    partition: int
    due_us: int | None
    event_us: int


def pack_entry(partition: int, due_us: int | None, event_us: int, body: bytes) -> bytes:
    return _HEAD.pack(partition, NEVER if due_us is None else int(due_us), int(event_us)) + body


def read_head(value: bytes) -> EntryHead:
    partition, due, event_us = _HEAD.unpack_from(value)
    return EntryHead(partition, None if due == NEVER else due, event_us)


def read_body(value: bytes) -> bytes:
    return bytes(memoryview(value)[_HEAD.size:])


class DueEntry(NamedTuple):
    """A table entry whose timer has to look at it now, with its partition's stream time."""

    key: bytes
    value: bytes
    partition: int
    now_us: int


def due_entries(entries: Iterable[tuple[bytes, bytes]], clocks: PartitionClocks) -> Iterator[DueEntry]:
    """The entries (key, packed value) due at their partition's stream time, in the order given.

    An entry is due when its ``due_us`` is set and not after the stream time of its partition; a
    partition whose clock has seen nothing yet has no due entries. Lazy on purpose: each entry is
    judged when the caller asks for it, by the clock as it reads then (stream time runs on with the
    wall clock while the timer acts on the entries before it), and a caller may stop early.
    """
    for key, value in entries:
        head = read_head(value)
        now = clocks.now_us(head.partition)
        if head.due_us is None or now is None or head.due_us > now:
            continue
        yield DueEntry(key, value, head.partition, now)


@dataclass
class GroupEntry:
    """A group id's slot plus the rollout event ids already emitted in one of its group records."""

    slot: GroupSlot
    done: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        done = orjson.dumps(self.done)
        return struct.pack("<I", len(done)) + done + self.slot.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> GroupEntry:
        (n,) = struct.unpack_from("<I", data)
        return cls(GroupSlot.from_bytes(data[4 + n:]), list(orjson.loads(data[4:4 + n])))
