"""The spool on a disk that fills up (a size-limited tmpfs this test mounts): a torn append is cut back at
once so no confirmed record is ever cut away, the cursor moves without new space so acknowledged segments
can free the disk, and the drainer survives a failed round and goes on once space returns (issue 17)."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from producers.delivery import CallPublisher, Spool

from .kafka_helpers import consume_all

NewTopicFactory = Callable[..., str]  # the new_topic fixture of tests/conftest.py


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for this test (the machines this project runs on are root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a size-limited tmpfs for the disk-full tests: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Write a filler file until the disk is full; returns it (delete it to free the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0
    return filler


def test_an_append_that_fills_the_disk_is_cut_back_and_no_confirmed_record_is_lost(small_disk: Path) -> None:
    spool_dir = small_disk / "spool"
    with Spool(spool_dir) as spool:
        confirmed = [os.urandom(1000) for _ in range(3)]
        spool.append_batch([("t", b"k", v) for v in confirmed])
        filler = fill(small_disk)
        # Part of this frame fits in the segment's last page, the rest does not: a torn write.
        with pytest.raises(OSError) as full:
            spool.append("t", b"k", os.urandom(20_000))
        assert full.value.errno == errno.ENOSPC
        filler.unlink()  # space again: the next appends are confirmed after the cut, not after torn bytes
        later = [os.urandom(1000) for _ in range(2)]
        spool.append_batch([("t", b"k", v) for v in later])
    with Spool(spool_dir) as reopened:
        assert reopened.recovery.truncated_bytes == 0
        assert [r.value for r in reopened.read(0)] == confirmed + later


def test_the_cursor_moves_on_a_full_disk_and_acknowledged_segments_free_it(small_disk: Path) -> None:
    spool_dir = small_disk / "spool"
    with Spool(spool_dir, segment_bytes=100_000) as spool:
        for _ in range(50):  # one append each: segments seal at 100 kB, about ten records each
            spool.append("t", b"k", os.urandom(10_000))
        fill(small_disk)
        spool.ack(30)  # no new space needed to write the cursor
        assert os.statvfs(small_disk).f_bavail > 0, "the acknowledged segments were removed"
    with Spool(spool_dir) as reopened:
        assert reopened.cursor == 30 and reopened.pending == 20


@pytest.mark.kafka
def test_the_drainer_survives_a_full_disk_and_goes_on_when_space_returns(
        small_disk: Path, kafka_bootstrap: str, new_topic: NewTopicFactory) -> None:
    """A record Kafka refuses must be quarantined, but the disk is full: the round fails, the drainer logs,
    backs off and retries, and finishes once space is freed."""
    topic = new_topic(partitions=1)
    spool_dir = small_disk / "spool"
    poison = os.urandom(150_000)
    with Spool(spool_dir) as spool:
        spool.append_batch([(topic, b"r", b"first"), (topic, b"r", poison), (topic, b"r", b"third")])
    filler = fill(small_disk)

    async def run() -> None:
        config = {"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 100_000}
        async with CallPublisher(config, spool_dir, 5.0) as publisher:
            deadline = time.monotonic() + 30
            while publisher.stats().delivery_errors < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            stats = publisher.stats()
            assert stats.delivery_errors >= 2 and stats.spool_depth == 2, stats  # "first" went; stuck after
            filler.unlink()
            assert await publisher.wait_drained(30), publisher.stats()
            assert publisher.stats().quarantined == 1

    asyncio.run(run())
    assert consume_all(kafka_bootstrap, topic, 2) == [(b"r", b"first"), (b"r", b"third")]
