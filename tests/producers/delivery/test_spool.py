"""The write-ahead spool on its own: order, durability of the cursor, torn tails, real crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.delivery.spool import SEGMENT_SUFFIX, Spool, SpoolCorrupt, SpoolError, encode_frame
from schemas.local_paths import REPO_ROOT


def _items(n: int, start: int = 0, size: int = 40) -> list[tuple[str, bytes, bytes]]:
    return [("tokentrail.calls", f"rollout-{i % 3}".encode(), f"value-{i}-".encode() * size) for i in
            range(start, start + n)]


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SEGMENT_SUFFIX}"))


def test_append_and_read_keep_order_across_segments(tmp_path: Path) -> None:
    items = _items(200)
    with Spool(tmp_path, segment_bytes=4096) as spool:
        seqs = [seq for chunk in range(0, 200, 7) for seq in spool.append_batch(items[chunk : chunk + 7])]
        assert seqs == list(range(200))
        assert len(_segments(tmp_path)) > 5  # the small segment size forced several rolls
        got = spool.read(0, max_records=10_000, max_bytes=1 << 30)
        assert [(r.topic, r.key, r.value) for r in got] == items
        assert [r.seq for r in got] == list(range(200))


def test_read_respects_limits_and_continues_where_it_stopped(tmp_path: Path) -> None:
    items = _items(50)
    with Spool(tmp_path, segment_bytes=2048) as spool:
        spool.append_batch(items)
        seen: list[int] = []
        cursor = 0
        while cursor < spool.next_seq:
            batch = spool.read(cursor, max_records=6, max_bytes=10_000)
            assert 1 <= len(batch) <= 6
            seen.extend(r.seq for r in batch)
            cursor = batch[-1].seq + 1
        assert seen == list(range(50))
        # A single record larger than max_bytes is still returned (at least one per read).
        assert len(spool.read(0, max_records=5, max_bytes=1)) == 1


def test_cursor_is_durable_and_acknowledged_segments_are_deleted(tmp_path: Path) -> None:
    with Spool(tmp_path, segment_bytes=1024) as spool:
        for item in _items(30):
            spool.append(*item)
        before = len(_segments(tmp_path))
        spool.ack(17)
        assert spool.pending == 13
        assert len(_segments(tmp_path)) < before
    with Spool(tmp_path, segment_bytes=1024) as spool:
        assert spool.cursor == 17
        assert spool.pending == 13
        assert [r.seq for r in spool.read(17, max_records=100)] == list(range(17, 30))
        with pytest.raises(ValueError):
            spool.read(3)
        spool.ack(30)
        assert spool.pending == 0
        assert _segments(tmp_path) == []
        # Sequences continue after a full drain; nothing restarts at zero.
        assert spool.append("t", b"k", b"v") == 30
    with Spool(tmp_path) as spool:
        assert (spool.cursor, spool.next_seq, spool.pending) == (30, 31, 1)


def test_torn_tail_is_truncated_on_open(tmp_path: Path) -> None:
    items = _items(5)
    with Spool(tmp_path) as spool:
        spool.append_batch(items)
    segment = _segments(tmp_path)[-1]
    good_size = segment.stat().st_size
    torn = encode_frame(5, "tokentrail.calls", b"k", b"x" * 1000)[:700]  # a write cut short by a crash
    with open(segment, "ab") as fh:
        fh.write(torn)
    with Spool(tmp_path) as spool:
        assert spool.recovery.truncated_bytes == 700
        assert spool.recovery.pending == 5
        assert segment.stat().st_size == good_size
        assert spool.append("tokentrail.calls", b"k", b"after") == 5
        got = spool.read(0, max_records=100)
        assert [r.value for r in got] == [v for _, _, v in items] + [b"after"]


def test_checksum_mismatch_in_the_last_frame_is_a_torn_tail(tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.append_batch(_items(4))
    segment = _segments(tmp_path)[-1]
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0xFF
    segment.write_bytes(bytes(data))
    with Spool(tmp_path) as spool:
        assert spool.recovery.truncated_bytes > 0
        assert [r.seq for r in spool.read(0)] == [0, 1, 2]


def test_damage_inside_a_sealed_segment_is_an_error(tmp_path: Path) -> None:
    with Spool(tmp_path, segment_bytes=1024) as spool:
        for item in _items(20):
            spool.append(*item)
    first = _segments(tmp_path)[0]
    data = bytearray(first.read_bytes())
    data[20] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(SpoolCorrupt, match="sealed segment"):
        Spool(tmp_path, segment_bytes=1024)


def test_one_owner_per_spool_directory(tmp_path: Path) -> None:
    with Spool(tmp_path), pytest.raises(SpoolError, match="in use"):
        Spool(tmp_path)
    with Spool(tmp_path) as spool:  # released on close
        assert spool.pending == 0


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(min_value=0, max_value=10_000), count=st.integers(min_value=1, max_value=12))
def test_any_truncation_recovers_a_prefix(
    tmp_path_factory: pytest.TempPathFactory, cut: int, count: int
) -> None:
    directory = tmp_path_factory.mktemp("spool")
    items = _items(count, size=5)
    with Spool(directory) as spool:
        spool.append_batch(items)
    segment = _segments(directory)[-1]
    size = segment.stat().st_size
    keep = cut % (size + 1)
    os.truncate(segment, keep)
    with Spool(directory) as spool:
        got = spool.read(0, max_records=100)
        assert [(r.topic, r.key, r.value) for r in got] == items[: len(got)]
        assert spool.next_seq == len(got)
        kept_frames = sum(len(encode_frame(i, *items[i])) for i in range(len(got)))
        assert spool.recovery.truncated_bytes == keep - kept_frames


_WRITER = textwrap.dedent(
    """
    import sys
    from producers.delivery.spool import Spool
    spool = Spool(sys.argv[1], segment_bytes=64 * 1024)
    i = 0
    while True:
        batch = [("tokentrail.calls", b"r%d" % (n % 4), b"%08d" % n * 50) for n in range(i, i + 3)]
        seqs = spool.append_batch(batch)
        i += 3
        print(seqs[-1], flush=True)  # durable now: the parent may rely on it
    """
)


def test_killed_writer_loses_nothing_it_acknowledged(tmp_path: Path) -> None:
    """SIGKILL a process in the middle of appending; every append it reported as done survives."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)],
        stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )
    assert proc.stdout is not None
    last_acknowledged = -1
    deadline = time.monotonic() + 30
    while last_acknowledged < 600 and time.monotonic() < deadline:
        last_acknowledged = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert last_acknowledged >= 600
    with Spool(tmp_path, segment_bytes=64 * 1024) as spool:
        assert spool.next_seq > last_acknowledged
        records = spool.read(0, max_records=1_000_000, max_bytes=1 << 30)
        assert [r.seq for r in records] == list(range(spool.next_seq))
        assert all(r.value == b"%08d" % r.seq * 50 and r.key == b"r%d" % (r.seq % 4) for r in records)
