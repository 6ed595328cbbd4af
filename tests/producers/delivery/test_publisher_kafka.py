"""CallPublisher against a real broker: acknowledged delivery, spooling while the broker is down,
in-order exactly-once arrival after it returns, and recovery of a crashed process's spool."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from producers.delivery import CallPublisher, DeliveryReceipt, Spool
from schemas.local_paths import REPO_ROOT
from tokentrail.settings import Settings

from .kafka_helpers import PrivateBroker, consume_all, create_topic, free_port

pytestmark = pytest.mark.kafka
NewTopicFactory = Callable[..., str]  # the new_topic fixture of tests/conftest.py


def _value(key: int, index: int) -> bytes:
    return b"rollout-%03d/call-%05d|" % (key, index) + b"x" * 200


def _describe_difference(got: dict[bytes, list[bytes]], expected: dict[bytes, list[bytes]]) -> str:
    """Per key: how many records are missing, duplicated, and where the order first differs."""
    lines = []
    for key in sorted(set(got) | set(expected)):
        have, want = got.get(key, []), expected.get(key, [])
        if have == want:
            continue
        first = next((i for i, (a, b) in enumerate(zip(have, want, strict=False)) if a != b), None)
        at = f"{have[first][:24]!r} vs {want[first][:24]!r}" if first is not None else "-"
        lines.append(
            f"{key!r}: {len(have)} read, {len(want)} expected, {len(set(want) - set(have))} missing, "
            f"{len(have) - len(set(have))} duplicated, first difference at {first}: {at}"
        )
    return "\n".join(lines)


def _per_key(records: list[tuple[bytes, bytes]]) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = defaultdict(list)
    for key, value in records:
        out[key].append(value)
    return out


def test_direct_delivery_is_acknowledged_in_order(
    kafka_bootstrap: str, new_topic: NewTopicFactory, tokentrail_settings: Settings, tmp_path: Path
) -> None:
    topic = new_topic(partitions=3)
    keys, per_key = 20, 25
    settings = tokentrail_settings.model_copy(
        update={"gateway": tokentrail_settings.gateway.model_copy(update={"spool_dir": tmp_path / "spool"})}
    )

    async def run() -> list[DeliveryReceipt]:
        async with CallPublisher.from_settings(settings.kafka, settings.gateway) as sink:

            async def rollout(k: int) -> list[DeliveryReceipt]:
                return [await sink.deliver(topic, b"r%03d" % k, _value(k, i)) for i in range(per_key)]

            batches = await asyncio.gather(*(rollout(k) for k in range(keys)))
            stats = sink.stats()
            assert stats.delivered_direct == keys * per_key and stats.spooled == 0 and stats.spool_depth == 0
            assert stats.kafka_reachable
            return [r for batch in batches for r in batch]

    receipts = asyncio.run(run())
    assert all(not r.spooled and r.offset is not None and r.offset >= 0 for r in receipts)
    records = consume_all(kafka_bootstrap, topic, keys * per_key)
    assert len(records) == keys * per_key
    got = _per_key(records)
    assert got == {b"r%03d" % k: [_value(k, i) for i in range(per_key)] for k in range(keys)}


def test_broker_stop_spools_and_restart_delivers_everything_once_in_order(
    private_broker: PrivateBroker, tmp_path: Path
) -> None:
    """Stop the broker in the middle of a run; deliveries keep returning; after the restart every
    record is on the topic exactly once, in each rollout's order."""
    topic = create_topic(private_broker.bootstrap)
    keys = 8
    timeout_s = 2.0
    phase: dict[str, int] = {}

    async def run() -> tuple[list[int], list[DeliveryReceipt], list[float]]:
        sink = CallPublisher({"bootstrap.servers": private_broker.bootstrap}, tmp_path / "spool", timeout_s)
        await sink.start()
        receipts: list[DeliveryReceipt] = []
        latencies_while_down: list[float] = []
        broker_down = asyncio.Event()
        finish = asyncio.Event()

        async def rollout(k: int) -> int:
            i = 0
            while not finish.is_set():  # a rollout's calls are sequential, as a harness makes them
                began = time.perf_counter()
                receipts.append(await sink.deliver(topic, b"r%03d" % k, _value(k, i)))
                if broker_down.is_set():
                    latencies_while_down.append(time.perf_counter() - began)
                i += 1
                await asyncio.sleep(0.005)
            return i

        tasks = [asyncio.create_task(rollout(k)) for k in range(keys)]
        try:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(private_broker.stop)
            broker_down.set()
            phase["at_stop"] = len(receipts)
            await asyncio.sleep(timeout_s * 2.5)  # keep delivering while the broker is away
            phase["before_restart"] = len(receipts)
            await asyncio.to_thread(private_broker.start)
            broker_down.clear()
            await asyncio.sleep(1.0)
            finish.set()
            counts = await asyncio.gather(*tasks)
            assert await sink.wait_drained(90), f"spool not drained: {sink.stats()}"
            stats = sink.stats()
            phase["spooled"], phase["drained"] = stats.spooled, stats.drained
            assert stats.spool_depth == 0 and stats.delivery_errors > 0
        finally:
            finish.set()
            await sink.close()
        return counts, receipts, latencies_while_down

    counts, receipts, latencies = asyncio.run(run())
    while_down = phase["before_restart"] - phase["at_stop"]
    assert while_down > 50, "deliveries must keep returning while Kafka is down"
    assert phase["spooled"] > 50 and phase["drained"] == phase["spooled"]
    assert sum(r.spooled for r in receipts) == phase["spooled"]
    assert max(latencies) < timeout_s + 2.0  # nobody waits much past the delivery timeout
    records = consume_all(private_broker.bootstrap, topic, sum(counts))
    got = _per_key(records)
    expected = {b"r%03d" % k: [_value(k, i) for i in range(n)] for k, n in enumerate(counts)}
    assert got == expected, "not exactly once in order:\n" + _describe_difference(got, expected)
    assert not list((tmp_path / "spool").glob("*.seg")), "drained segments are deleted"


_CRASHING_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from producers.delivery import CallPublisher

    async def main():
        # Nothing listens on this port: every record lands in the spool.
        sink = CallPublisher({"bootstrap.servers": sys.argv[1]}, sys.argv[2], 1.0)
        await sink.start()
        for i in range(int(sys.argv[3])):
            receipt = await sink.deliver(sys.argv[4], b"r%d" % (i % 5), b"record-%06d" % i)
            assert receipt.spooled
        print("spooled", flush=True)
        await asyncio.sleep(3600)  # killed here, without closing anything

    asyncio.run(main())
    """
)


def test_crashed_process_spool_is_drained_by_the_next_one(
    kafka_bootstrap: str, new_topic: NewTopicFactory, tmp_path: Path
) -> None:
    topic = new_topic(partitions=3)
    count = 300
    spool_dir = tmp_path / "spool"
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_WRITER, dead, str(spool_dir), str(count), topic],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO_ROOT,
    )
    assert proc.stdout is not None
    began = time.monotonic()
    assert proc.stdout.readline().strip() == "spooled"
    spooling_s = time.monotonic() - began
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert spooling_s < 30

    with Spool(spool_dir) as spool:  # what the crashed process left behind
        assert spool.pending == count

    async def drain() -> None:
        async with CallPublisher({"bootstrap.servers": kafka_bootstrap}, spool_dir, 5.0) as sink:
            assert await sink.wait_drained(60), sink.stats()
            assert sink.stats().drained == count
            # Drained: new records go straight to Kafka again.
            receipt = await sink.deliver(topic, b"r0", b"after-restart")
            assert not receipt.spooled

    asyncio.run(drain())
    records = consume_all(kafka_bootstrap, topic, count + 1)
    got = _per_key(records)
    expected: dict[bytes, list[bytes]] = defaultdict(list)
    for i in range(count):
        expected[b"r%d" % (i % 5)].append(b"record-%06d" % i)
    expected[b"r0"].append(b"after-restart")
    assert got == expected
