"""A local write-ahead spool: records that could not reach Kafka wait here, durably, in order.

Layout of a spool directory:

    LOCK                      flock'ed by the one process that owns the spool
    cursor                    two slots of (u64 sequence of the first record not yet acknowledged by
                              Kafka, crc32); the valid slot with the larger sequence counts
    00000000000000000042.seg  append-only segment whose first record has sequence 42

Each record in a segment is one frame::

    u32 body_length | u32 crc32(body) | body
    body = u64 seq | u16 topic_length | u32 key_length | topic | key | value

Sequences are consecutive across segments. ``append_batch`` writes several frames and fsyncs once
(group commit); the cursor moves only after Kafka acknowledged records. It is written in place into
the slot that does not hold the current value, then fsynced: a torn write spoils only that slot, and the
write needs no new disk space, so acknowledged segments can be removed even from a full disk.

A disk that fills mid-append (a short write, ENOSPC, a failed fsync) leaves no torn frame behind: the
segment is cut back at once to its last confirmed frame and the append fails, so the next append starts
on a frame boundary and nothing confirmed is ever cut away. If even that cut fails, the spool refuses
further appends until it is reopened. A crash can leave a torn frame at the end of the newest segment:
``open`` detects it (short frame or crc mismatch) and truncates the file there. A bad frame anywhere
else is not a torn write but damage, and raises ``SpoolCorrupt``.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

_FRAME_HEADER = struct.Struct("<II")  # body length, crc32 of body
_BODY_HEADER = struct.Struct("<QHI")  # seq, topic length, key length
_CURSOR = struct.Struct("<QI")  # cursor, crc32 of the cursor bytes
SEGMENT_SUFFIX = ".seg"
MAX_BODY_BYTES = 1 << 30  # a longer length field can only be damage


class SpoolError(RuntimeError):
    """The spool cannot be used (locked by another process, unreadable)."""


class SpoolCorrupt(SpoolError):
    """A damaged frame that is not a torn tail of the newest segment."""


@dataclass(frozen=True)
class SpoolRecord:
    seq: int
    topic: str
    key: bytes
    value: bytes


@dataclass(frozen=True)
class RecoveryReport:
    """What ``open`` found: how many records wait, and whether a torn tail was cut off."""

    pending: int
    truncated_bytes: int
    segments: int


@dataclass
class _Segment:
    first_seq: int
    path: Path
    size: int
    records: int


def _segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def encode_frame(seq: int, topic: str, key: bytes, value: bytes) -> bytes:
    topic_bytes = topic.encode()
    body = b"".join((_BODY_HEADER.pack(seq, len(topic_bytes), len(key)), topic_bytes, key, value))
    return _FRAME_HEADER.pack(len(body), zlib.crc32(body)) + body


def _decode_body(body: bytes) -> SpoolRecord:
    seq, topic_len, key_len = _BODY_HEADER.unpack_from(body)
    start = _BODY_HEADER.size
    topic = body[start : start + topic_len].decode()
    key = body[start + topic_len : start + topic_len + key_len]
    value = body[start + topic_len + key_len :]
    return SpoolRecord(seq, topic, key, value)


def _read_frame(data: bytes | memoryview, offset: int) -> tuple[SpoolRecord, int] | None:
    """The record at ``offset`` and the offset after it, or None if the frame there is incomplete/bad."""
    if offset + _FRAME_HEADER.size > len(data):
        return None
    length, crc = _FRAME_HEADER.unpack_from(data, offset)
    start = offset + _FRAME_HEADER.size
    if length < _BODY_HEADER.size or length > MAX_BODY_BYTES or start + length > len(data):
        return None
    body = bytes(data[start : start + length])
    if zlib.crc32(body) != crc:
        return None
    record = _decode_body(body)
    if _BODY_HEADER.size + len(record.topic.encode()) + len(record.key) > length:
        return None
    return record, start + length


def read_frames(data: bytes | memoryview) -> tuple[list[tuple[int, SpoolRecord]], int]:
    """(offset, record) of every whole frame from the start of a segment's bytes, and the offset where the
    whole frames end: the end of the data, or a torn or damaged frame. For readers that must not take the
    spool's lock (the residue scan reads a running gateway's segments)."""
    found: list[tuple[int, SpoolRecord]] = []
    offset = 0
    while (frame := _read_frame(data, offset)) is not None:
        found.append((offset, frame[0]))
        offset = frame[1]
    return found, offset


def _cursor_slot_bytes(cursor: int) -> bytes:
    packed = struct.pack("<Q", cursor)
    return packed + struct.pack("<I", zlib.crc32(packed))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """Durable FIFO of (topic, key, value) records with a Kafka-acknowledged cursor.

    Thread-safe; intended to be driven from one I/O thread (the publisher's executor) so that fsyncs
    never block an event loop.
    """

    def __init__(self, directory: Path | str, segment_bytes: int = 64 * 1024 * 1024) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._active_fd: int | None = None
        self._cursor = 0
        self._next_seq = 0
        self._pending_bytes = 0
        # Where the next sequential read starts, so a draining reader does not rescan segments.
        self._read_hint: tuple[int, int, int] | None = None  # (seq, segment first_seq, offset)
        self._cursor_slot = 0  # the slot holding the current cursor; the next write goes to the other
        # Set when a failed append could not be cut back: appending after a torn frame would lose data.
        self._broken: str | None = None
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise SpoolError(f"spool {self.directory} is in use by another process") from exc
        self.recovery = self._recover()

    # ------------------------------------------------------------------ state

    @property
    def cursor(self) -> int:
        """Sequence of the first record Kafka has not acknowledged."""
        return self._cursor

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def pending(self) -> int:
        return self._next_seq - self._cursor

    @property
    def pending_bytes(self) -> int:
        """Bytes on disk in segments that still hold unacknowledged records."""
        return self._pending_bytes

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> RecoveryReport:
        self._cursor = self._read_cursor()
        paths = sorted(self.directory.glob(f"*{SEGMENT_SUFFIX}"))
        truncated = 0
        expected: int | None = None
        for index, path in enumerate(paths):
            first_seq = int(path.name.removesuffix(SEGMENT_SUFFIX))
            if expected is not None and first_seq != expected:
                raise SpoolCorrupt(f"{path}: starts at sequence {first_seq}, expected {expected}")
            data = path.read_bytes()
            offset, records = 0, 0
            while offset < len(data):
                frame = _read_frame(data, offset)
                if frame is None or frame[0].seq != first_seq + records:
                    break
                records += 1
                offset = frame[1]
            if offset < len(data):
                if index != len(paths) - 1:
                    raise SpoolCorrupt(f"{path}: damaged frame at byte {offset} of a sealed segment")
                truncated = len(data) - offset
                with open(path, "r+b") as fh:  # cut the torn tail a crash left behind
                    fh.truncate(offset)
                    fh.flush()
                    os.fsync(fh.fileno())
            self._segments.append(_Segment(first_seq, path, offset, records))
            expected = first_seq + records
        self._next_seq = max(expected or 0, self._cursor)
        if self._segments and self._segments[0].first_seq > self._cursor:
            raise SpoolCorrupt(
                f"{self.directory}: cursor {self._cursor} precedes the first stored record "
                f"{self._segments[0].first_seq}; records are missing"
            )
        self._drop_acknowledged_segments()
        self._recount_pending_bytes()
        return RecoveryReport(self.pending, truncated, len(self._segments))

    def _read_cursor(self) -> int:
        path = self.directory / "cursor"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            self._create_cursor_file(path)
            return 0
        if len(raw) not in (_CURSOR.size, 2 * _CURSOR.size):  # one slot: written by an earlier version
            raise SpoolCorrupt(f"{path}: {len(raw)} bytes, expected {2 * _CURSOR.size}")
        valid = []
        for slot in range(len(raw) // _CURSOR.size):
            cursor, crc = _CURSOR.unpack_from(raw, slot * _CURSOR.size)
            if zlib.crc32(raw[slot * _CURSOR.size:slot * _CURSOR.size + 8]) == crc:
                valid.append((cursor, slot))
        if not valid:
            raise SpoolCorrupt(f"{path}: checksum mismatch in every slot")
        cursor, self._cursor_slot = max(valid)
        return cursor

    def _create_cursor_file(self, path: Path) -> None:
        """Both slots at 0, allocated now: later cursor writes overwrite in place and need no space."""
        tmp = self.directory / "cursor.tmp"
        slot = _cursor_slot_bytes(0)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, slot + slot)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(self.directory)

    def _write_cursor(self, cursor: int) -> None:
        slot = 1 - self._cursor_slot
        fd = os.open(self.directory / "cursor", os.O_WRONLY)
        try:
            os.pwrite(fd, _cursor_slot_bytes(cursor), slot * _CURSOR.size)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._cursor_slot = slot

    def _recount_pending_bytes(self) -> None:
        self._pending_bytes = sum(seg.size for seg in self._segments)

    # ------------------------------------------------------------------ append (group commit)

    def append_batch(self, items: list[tuple[str, bytes, bytes]]) -> list[int]:
        """Append records and fsync once; returns their sequences. Durable when it returns."""
        if not items:
            return []
        with self._lock:
            if self._broken:
                raise SpoolError(f"spool {self.directory} refuses appends until reopened: {self._broken}")
            seqs: list[int] = []
            frames: list[bytes] = []
            for topic, key, value in items:
                seqs.append(self._next_seq + len(seqs))
                frames.append(encode_frame(seqs[-1], topic, key, value))
            fd = self._writable_segment()
            segment = self._segments[-1]
            payload = b"".join(frames)
            try:
                view = memoryview(payload)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fdatasync(fd)
            except OSError as exc:  # disk full, I/O error: none of these frames counts
                self._cut_back(fd, segment, exc)
                raise
            segment.size += len(payload)
            segment.records += len(frames)
            self._pending_bytes += len(payload)
            self._next_seq += len(frames)
            if segment.size >= self.segment_bytes:
                self._seal_active()
            return seqs

    def _cut_back(self, fd: int, segment: _Segment, cause: OSError) -> None:
        """Remove what a failed append left after the last confirmed frame, before anything follows it."""
        try:
            os.ftruncate(fd, segment.size)
            os.fsync(fd)
        except OSError as exc:
            self._broken = f"a failed append ({cause}) could not be cut back ({exc})"
            self._seal_active()

    def append(self, topic: str, key: bytes, value: bytes) -> int:
        return self.append_batch([(topic, key, value)])[0]

    def _writable_segment(self) -> int:
        if self._active_fd is not None:
            return self._active_fd
        if self._segments and self._segments[-1].first_seq + self._segments[-1].records == self._next_seq:
            # Reopen the newest segment after recovery (its torn tail, if any, is already cut).
            segment = self._segments[-1]
            if segment.size < self.segment_bytes:
                self._active_fd = os.open(segment.path, os.O_WRONLY | os.O_APPEND)
                return self._active_fd
        path = self.directory / _segment_name(self._next_seq)
        self._active_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        fsync_dir(self.directory)  # the new file's name must survive a crash too
        self._segments.append(_Segment(self._next_seq, path, 0, 0))
        return self._active_fd

    def _seal_active(self) -> None:
        if self._active_fd is not None:
            os.close(self._active_fd)
            self._active_fd = None

    # ------------------------------------------------------------------ read

    def read(
        self, from_seq: int, max_records: int = 1000, max_bytes: int = 8 * 1024 * 1024
    ) -> list[SpoolRecord]:
        """Records with sequence >= ``from_seq`` in order (at least one if any), within the limits."""
        with self._lock:
            if from_seq < self._cursor:
                raise ValueError(f"sequence {from_seq} is already acknowledged (cursor {self._cursor})")
            out: list[SpoolRecord] = []
            size = 0
            seq = from_seq
            for segment in self._segments:
                end_seq = segment.first_seq + segment.records
                if end_seq <= seq:
                    continue
                offset = 0
                skip_from = segment.first_seq
                if self._read_hint and self._read_hint[0] == seq and self._read_hint[1] == segment.first_seq:
                    offset, skip_from = self._read_hint[2], seq
                with open(segment.path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read(segment.size - offset)
                pos = 0
                current = skip_from
                while current < end_seq:
                    frame = _read_frame(data, pos)
                    if frame is None:
                        raise SpoolCorrupt(f"{segment.path}: unreadable frame at byte {offset + pos}")
                    record, next_pos = frame
                    if record.seq >= seq:
                        if out and (len(out) >= max_records or size + len(record.value) > max_bytes):
                            self._read_hint = (record.seq, segment.first_seq, offset + pos)
                            return out
                        out.append(record)
                        size += len(record.value)
                    pos = next_pos
                    current += 1
                seq = end_seq
            self._read_hint = None
            return out

    # ------------------------------------------------------------------ acknowledge

    def ack(self, upto_seq: int) -> None:
        """Kafka acknowledged every record with sequence < ``upto_seq``: move the cursor durably."""
        with self._lock:
            if upto_seq <= self._cursor:
                return
            if upto_seq > self._next_seq:
                raise ValueError(f"cannot acknowledge up to {upto_seq}: only {self._next_seq} appended")
            self._write_cursor(upto_seq)
            self._cursor = upto_seq
            if self._cursor == self._next_seq:
                self._seal_active()  # fully drained: every segment can go, the next append starts fresh
            self._drop_acknowledged_segments()
            self._recount_pending_bytes()

    def _drop_acknowledged_segments(self) -> None:
        keep: list[_Segment] = []
        dropped = False
        for index, segment in enumerate(self._segments):
            is_active = index == len(self._segments) - 1 and self._active_fd is not None
            if segment.first_seq + segment.records <= self._cursor and not is_active:
                segment.path.unlink(missing_ok=True)
                dropped = True
            else:
                keep.append(segment)
        self._segments = keep
        if dropped:
            self._read_hint = None
            fsync_dir(self.directory)

    # ------------------------------------------------------------------ close

    def close(self) -> None:
        with self._lock:
            self._seal_active()
            if self._lock_fd >= 0:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
                self._lock_fd = -1

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
