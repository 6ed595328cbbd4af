"""The residue scan of a gateway's spool directory: every file under it, read without taking its lock.

A spool segment is read frame by frame (``spool.read_frames``): each frame's topic, key and value as raw
bytes and its value decoded by the codec, reported as ``path#seq``. Bytes after the last whole frame (a
torn tail a crash left, or damage) are searched raw, as ``path@offset``. Every other file (the cursor,
quarantined records and their notes, the attempts' key secret) is searched raw as a whole, and a
quarantined ``.avro`` record decoded too. The matching is ``schemas.residue``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from producers.delivery.spool import SEGMENT_SUFFIX, read_frames
from schemas.residue import Matcher, Tally

STORE = "spool"


def _files(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, _dirs, names in os.walk(root):
        found += [Path(folder) / n for n in sorted(names)]
    return found


def scan_spool(roots: Iterable[Path], matcher: Matcher, tally: Tally, *,
               progress: Callable[[str], None] | None = None) -> None:
    """Scan every file under each spool directory ``roots`` (a missing one is noted as skipped); records
    are decoded by the matcher's decoder (what it cannot decode, ciphertext, was searched raw)."""
    for root in roots:
        if not root.exists():
            tally.skipped.append(f"spool {root} (does not exist)")
            continue
        files = _files(root) if root.is_dir() else [root]
        for path in files:
            try:
                data = path.read_bytes()
            except OSError as exc:  # removed while we looked (a drained segment), or unreadable
                if path.exists():
                    tally.incomplete.append(f"spool {path}: {exc}")
                continue
            tally.count("spool_files")
            tally.count("spool_bytes", len(data))
            if path.name.endswith(SEGMENT_SUFFIX):
                _scan_segment(path, data, matcher, tally)
            else:
                hits = matcher.in_bytes(data, "file")
                if path.suffix == ".avro":
                    hits += matcher.in_encoded(data, "decoded")
                tally.add(STORE, str(path), hits)
        if progress:
            progress(f"spool {root}: {len(files)} files")


def _scan_segment(path: Path, data: bytes, matcher: Matcher, tally: Tally) -> None:
    frames, end = read_frames(data)
    for _offset, record in frames:
        tally.count("spool_records")
        hits = (matcher.in_bytes(record.topic.encode(), "topic") + matcher.in_bytes(record.key, "key")
                + matcher.in_bytes(record.value, "value") + matcher.in_encoded(record.value, "decoded"))
        tally.add(STORE, f"{path}#{record.seq}", hits)
    if end < len(data):
        tally.add(STORE, f"{path}@{end}", matcher.in_bytes(data[end:], "tail"))
