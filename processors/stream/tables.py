"""Reading and writing the app's tables: memory stores restored from their changelog topics.

Every write waits for its changelog write, with the partition given explicitly (the timers write
outside any event); the timers scan only the entries of partitions this worker owns. The values are
``processors.stream.entries``: a small header in front of the core's state bytes.
"""

from __future__ import annotations

from typing import Any

import faust

from processors.stream.clock import PartitionClocks
from processors.stream.entries import read_head
from processors.stream.state_budget import admit

RAW_TABLE: dict[str, Any] = {"key_type": bytes, "value_type": bytes}


async def put(table: Any, partition: int, key: bytes, value: bytes) -> None:
    """Write a table entry and wait for its changelog write (explicit partition: timers write too).
    An entry past the table's budget is refused (StateOverflow) before anything is written."""
    admit(table, key, value)
    table.data[key] = value
    # The memory store drops keys of partitions this worker no longer owns after each recovery,
    # but knows the partition only of keys it restored itself: tell it about ours.
    owner = getattr(table.data, "_key_partition", None)
    if owner is not None:
        owner[key] = partition
    future = await table.changelog_topic.send(key=key, value=value, partition=partition, force=True)
    await future


async def delete(table: Any, partition: int, key: bytes) -> None:
    table.data.pop(key, None)
    owner = getattr(table.data, "_key_partition", None)
    if owner is not None:
        owner.pop(key, None)
    future = await table.changelog_topic.send(key=key, value=None, partition=partition, force=True)
    await future


def owned(app: faust.App, topic: str) -> set[int]:
    """The partitions of ``topic`` assigned to this worker."""
    return {tp.partition for tp in app.consumer.assignment() if tp.topic == topic}


def scan(table: Any, owned: set[int], clocks: PartitionClocks) -> list[tuple[bytes, bytes]]:
    """Entries of owned partitions (others belong to another worker now; the store drops them
    after the next recovery), seeding the clocks of partitions not seen yet."""
    entries, newest = [], {}
    for key, value in list(table.data.items()):
        head = read_head(value)
        if head.partition not in owned:
            continue
        entries.append((key, value))
        newest[head.partition] = max(newest.get(head.partition, head.event_us), head.event_us)
    for partition, event_us in newest.items():
        if clocks.now_us(partition) is None:
            clocks.observe(partition, event_us)
    for partition in clocks.known() - owned:
        clocks.forget(partition)
    return entries
