"""The app's small parts: stream clocks, table entry framing, key placement like confluent-kafka's."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from processors.grouper import GroupSlot, Member
from processors.stream.clock import PartitionClocks
from processors.stream.entries import DueEntry, GroupEntry, due_entries, pack_entry, read_body, read_head
from processors.stream.topics import partition_for
from schemas.kafka.config import producer_config
from tokentrail.settings import Settings


def test_stream_clock_follows_events_and_wall_time_and_never_runs_back() -> None:
    wall = [100.0]
    clocks = PartitionClocks(monotonic=lambda: wall[0])
    assert clocks.now_us(0) is None
    clocks.observe(0, 5_000_000)
    wall[0] += 2.5
    assert clocks.now_us(0) == 7_500_000  # event time + wall time since
    clocks.observe(0, 6_000_000)  # an older event does not move it back
    assert clocks.now_us(0) == 7_500_000
    clocks.observe(0, 9_000_000)  # a newer one moves it forward
    assert clocks.now_us(0) == 9_000_000 and clocks.now_us(1) is None


def test_entries_round_trip_header_body_and_group_markers() -> None:
    value = pack_entry(5, None, 123, b"state")
    head = read_head(value)
    assert (head.partition, head.due_us, head.event_us, read_body(value)) == (5, None, 123, b"state")
    assert read_head(pack_entry(1, 777, 9, b"")).due_us == 777
    slot = GroupSlot("g", "{}", 3, 10, members=[Member("r0", "e0", 10), Member("r1", "e1", 11)])
    back = GroupEntry.from_bytes(GroupEntry(slot, done=["x", "y"]).to_bytes())
    assert back.done == ["x", "y"] and [m.event_id for m in back.slot.members] == ["e0", "e1"]


def test_due_entries_are_those_whose_time_came_at_their_partitions_stream_time() -> None:
    wall = [0.0]
    clocks = PartitionClocks(monotonic=lambda: wall[0])
    clocks.observe(0, 1_000)
    clocks.observe(1, 50_000)
    entries = [
        (b"never", pack_entry(0, None, 900, b"a")),  # no timer set: never due
        (b"past", pack_entry(0, 999, 900, b"b")),
        (b"exact", pack_entry(1, 50_000, 40_000, b"c")),  # due at the stream time itself
        (b"future", pack_entry(0, 1_001, 900, b"d")),
        (b"unseen", pack_entry(2, 0, 0, b"e")),  # a partition whose clock saw nothing yet
        (b"soon", pack_entry(1, 50_400, 40_000, b"f")),
    ]
    due = due_entries(entries, clocks)
    assert next(due) == DueEntry(b"past", entries[1][1], 0, 1_000)
    assert next(due) == DueEntry(b"exact", entries[2][1], 1, 50_000)
    # Lazy: an entry is judged by the clock when the scan reaches it, while the timer acts in between.
    wall[0] += 0.0005
    assert [(d.key, d.partition, d.now_us) for d in due] == [(b"future", 0, 1_500), (b"soon", 1, 50_500)]
    assert read_body(next(due_entries(entries[-1:], clocks)).value) == b"f"


def test_outputs_are_placed_where_confluent_kafka_puts_the_same_key(
        kafka_bootstrap: str, tokentrail_settings: Settings, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=6)
    producer = Producer(producer_config(tokentrail_settings.kafka))
    placed: dict[bytes, int] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None
        placed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    keys = [f"rollout-{i}".encode() for i in range(40)]
    for key in keys:
        producer.produce(topic, key=key, value=b"x", on_delivery=delivered)
    assert producer.flush(30) == 0
    assert placed == {key: partition_for(key, 6) for key in keys}


def test_input_commits_stop_at_what_the_agents_finished(tokentrail_settings: Settings) -> None:
    """faust acks messages it skips in a rebalance; the commit must not pass input no agent finished,
    and faust's record of what is committed must be what the broker got. (The broker-side commit is
    replaced by a recorder: what is tested is which offsets reach it.)"""
    import asyncio

    from faust.types import TP

    from processors.stream.app import ProcessorsApp
    from processors.stream.worker_config import StreamConfig

    worker = ProcessorsApp(StreamConfig.resolve(tokentrail_settings.kafka, tokentrail_settings.processors,
                                                topic_prefix="cap-test"))
    inputs = worker.offsets
    consumer = worker.app.consumer
    calls, env, other = TP(worker.topics.calls, 0), TP(worker.topics.env, 1), TP("cap-test-other", 0)
    committed: list[dict] = []

    async def record(offsets: dict) -> bool:
        committed.append(dict(offsets))
        return True

    async def flushed() -> None:
        return None

    async def scenario() -> list[bool]:
        consumer._commit = record
        consumer.assignment = lambda: {calls, env, other}
        worker.app.producer.flush = flushed
        await inputs.install()
        inputs.next_offset[calls] = 5  # the agent finished offsets up to 4; faust acked (skipped) up to 8
        first = await consumer._commit_offsets({calls: 9, env: 3, other: 7})
        after_first = dict(consumer._committed_offset)
        inputs.next_offset[calls] = 12
        second = await consumer._commit_offsets({calls: 9})
        third = await consumer._commit_offsets({env: 3})  # nothing finished moved: nothing to commit
        assert after_first == {calls: 5, other: 7}
        return [first, second, third]

    assert asyncio.run(scenario()) == [True, True, False]
    # env: nothing finished since assignment, never committed; calls: what the agent finished, not faust's 9
    assert committed == [{calls: 5, other: 7}, {calls: 12}]
    assert consumer._committed_offset[calls] == 12


def test_each_input_partition_is_processed_in_offset_order_from_its_committed_offset(
        tokentrail_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a rebalance faust drops messages fetched under the old generation and, for a partition with no
    committed offset, does not seek back: the agent must rewind to the dropped message, not go on past
    it. (The consumer's seek and offset queries are replaced by recorders; what is tested is the order.)"""
    import asyncio
    from types import SimpleNamespace

    from faust.types import TP

    from processors.stream import commits
    from processors.stream.app import ProcessorsApp
    from processors.stream.worker_config import StreamConfig

    worker = ProcessorsApp(StreamConfig.resolve(tokentrail_settings.kafka, tokentrail_settings.processors,
                                                topic_prefix="order-test"))
    inputs = worker.offsets
    consumer = worker.app.consumer
    env, calls, late = TP(worker.topics.env, 0), TP(worker.topics.calls, 1), TP(worker.topics.env, 1)
    seeks: list[tuple[TP, int]] = []
    log_start = {env: 0, calls: 0, late: 10}

    async def seek(tp: TP, offset: int) -> None:
        seeks.append((tp, offset))

    async def earliest_offsets(*tps: TP) -> dict[TP, int]:
        return {tp: log_start[tp] for tp in tps}

    consumer.seek = seek
    consumer.earliest_offsets = earliest_offsets
    consumer._committed_offset.update({calls: 5, late: 3})

    async def deliver(tp: TP, offsets: list[int]) -> list[int]:
        """Offsets the agent processes, in the order faust hands them over."""
        done = []
        for offset in offsets:
            if await inputs.in_order(SimpleNamespace(tp=tp, offset=offset)):
                done.append(offset)
                inputs.next_offset[tp] = offset + 1
        return done

    # No committed offset; offset 0 dropped in a rebalance: 1 and 2 are passed over, one seek back to 0.
    assert asyncio.run(deliver(env, [1, 2, 0, 1, 2, 3])) == [0, 1, 2, 3]
    assert seeks == [(env, 0)]
    # Committed at 5: a re-delivered 4 was processed before; 5 on goes in order.
    assert asyncio.run(deliver(calls, [4, 5, 6])) == [5, 6]
    # Committed at 3 but retention deleted up to 9: nothing to rewind to, 10 is next.
    assert asyncio.run(deliver(late, [10, 11])) == [10, 11]
    assert worker.stats["lost.retention"] == 7 and len(seeks) == 1
    # Offsets 0 and 1 hold no records (transaction markers): the re-read from 0 starts at 2, and goes on.
    markers = TP(worker.topics.rollouts, 0)
    log_start[markers] = 0
    assert asyncio.run(deliver(markers, [3, 4, 2, 3, 4])) == [2, 3, 4]
    assert seeks[-1] == (markers, 0) and worker.stats["skipped.no_records"] == 2
    # Still only later messages after the retry interval (the fetcher dropped the re-read): seek again.
    again = TP(worker.topics.by_group, 0)
    log_start[again] = 0
    monkeypatch.setattr(commits, "REWIND_RETRY_S", 0.0)
    assert asyncio.run(deliver(again, [5, 6])) == []
    assert seeks[-2:] == [(again, 0), (again, 0)]
    # A revoked partition forgets its position: it resumes from the committed offset when it returns.
    asyncio.run(inputs.on_revoked(worker.app, {env}))
    assert env not in inputs.next_offset and calls in inputs.next_offset
