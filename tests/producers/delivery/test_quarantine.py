"""A record Kafka can never take never blocks the records behind it (issue 17: one 5 MB request stopped a
gateway's delivery for good). It is kept whole in the quarantine folder, and the next records flow."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from producers.delivery import CallPublisher, RecordQuarantined, Spool

from .kafka_helpers import consume_all

pytestmark = pytest.mark.kafka
NewTopicFactory = Callable[..., str]  # the new_topic fixture of tests/conftest.py
LIMIT = 200_000  # the producer's message.max.bytes in these tests


def _quarantined(spool_dir: Path) -> dict[str, tuple[dict, bytes]]:
    """sha256 -> (note, value) of every quarantined record."""
    folder = spool_dir / "quarantine"
    notes = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.exists() else []
    return {n["sha256"]: (n, (folder / f"{n['sha256'][:32]}.avro").read_bytes()) for n in notes}


def test_a_record_over_the_size_limit_is_quarantined_and_the_next_one_delivered(
        kafka_bootstrap: str, new_topic: NewTopicFactory, tmp_path: Path) -> None:
    topic = new_topic(partitions=1)
    huge = os.urandom(LIMIT + 1000)

    async def run() -> None:
        config = {"bootstrap.servers": kafka_bootstrap, "message.max.bytes": LIMIT}
        async with CallPublisher(config, tmp_path / "spool", 5.0) as publisher:
            assert (await publisher.deliver(topic, b"r1", b"before")).spooled is False
            with pytest.raises(RecordQuarantined, match="over Kafka's limit") as refused:
                await publisher.deliver(topic, b"r1", huge)
            assert refused.value.where.path.read_bytes() == huge
            after = await publisher.deliver(topic, b"r1", b"after")
            stats = publisher.stats()
            assert after.spooled is False, "the next record went to Kafka, not behind the big one"
            assert stats.spool_depth == 0 and stats.quarantined == 1

    asyncio.run(run())
    assert consume_all(kafka_bootstrap, topic, 2) == [(b"r1", b"before"), (b"r1", b"after")]
    (note, value), = _quarantined(tmp_path / "spool").values()
    assert value == huge and note["topic"] == topic and note["key"] == "r1"
    assert note["bytes"] == len(huge) + 2 and note["sha256"] == hashlib.sha256(huge).hexdigest()


def test_a_record_the_broker_refuses_for_good_is_quarantined_not_spooled(
        kafka_bootstrap: str, new_topic: NewTopicFactory, tmp_path: Path) -> None:
    """The producer would take it, the topic's max.message.bytes does not: the broker's verdict is final."""
    topic = new_topic(partitions=1, config={"max.message.bytes": "50000"})
    too_big_for_the_topic = os.urandom(120_000)  # random: compression cannot shrink it under the limit

    async def run() -> None:
        config = {"bootstrap.servers": kafka_bootstrap}
        async with CallPublisher(config, tmp_path / "spool", 10.0) as publisher:
            with pytest.raises(RecordQuarantined, match="refused the record for good"):
                await publisher.deliver(topic, b"k", too_big_for_the_topic)
            assert (await publisher.deliver(topic, b"k", b"small")).spooled is False
            assert publisher.stats().spool_depth == 0

    asyncio.run(run())
    assert consume_all(kafka_bootstrap, topic, 1) == [(b"k", b"small")]
    assert [v for _, v in _quarantined(tmp_path / "spool").values()] == [too_big_for_the_topic]


def test_a_spool_left_with_a_record_kafka_refuses_drains_around_it_after_a_restart(
        kafka_bootstrap: str, new_topic: NewTopicFactory, tmp_path: Path) -> None:
    """An earlier gateway spooled a record Kafka refuses (as main did): the restarted one must not retry it
    forever with every later record queued behind it."""
    topic = new_topic(partitions=1)
    spool_dir = tmp_path / "spool"
    poison = os.urandom(LIMIT + 5000)
    with Spool(spool_dir) as spool:
        spool.append_batch([(topic, b"r", b"first"), (topic, b"r", poison), (topic, b"r", b"third")])

    async def run() -> None:
        config = {"bootstrap.servers": kafka_bootstrap, "message.max.bytes": LIMIT}
        async with CallPublisher(config, spool_dir, 5.0) as publisher:
            assert await publisher.wait_drained(60), publisher.stats()
            assert publisher.stats().quarantined == 1
            assert (await publisher.deliver(topic, b"r", b"new")).spooled is False

    asyncio.run(run())
    assert consume_all(kafka_bootstrap, topic, 3) == [(b"r", b"first"), (b"r", b"third"), (b"r", b"new")]
    assert [v for _, v in _quarantined(spool_dir).values()] == [poison]
    with Spool(spool_dir) as spool:
        assert spool.pending == 0
