"""Records Kafka will never take, kept whole on local disk instead of blocking the records behind them.

A record over the producer's size limit, or one the broker refuses for good (its size, an invalid
record), cannot reach Kafka however often it is sent; spooled, it would stay first in the spool and hold
back every later record. It is written here, fsynced, under a name made of its content hash, beside a
JSON note of its topic, key, size and reason; the caller learns where. The value is the encoded event
(Avro, as it would have gone to Kafka), so an operator can read it with ``schemas.codec`` and publish it
by other means (a topic with a larger limit, a blob store). Nothing here is ever re-sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from producers.delivery.spool import fsync_dir


@dataclass(frozen=True)
class QuarantinedRecord:
    path: Path  # the record's value, as it would have gone to Kafka
    topic: str
    size: int  # bytes of key + value
    sha256: str  # of the value
    reason: str


class Quarantine:
    """A folder of undeliverable records; ``put`` is durable when it returns. Not thread-safe."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.count = sum(1 for _ in self.directory.glob("*.json")) if self.directory.exists() else 0

    def put(self, topic: str, key: bytes, value: bytes, reason: str) -> QuarantinedRecord:
        self.directory.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(value).hexdigest()
        stem = f"{digest[:32]}"
        path = self.directory / f"{stem}.avro"
        note = self.directory / f"{stem}.json"
        fresh = not note.exists()  # the same record again (a re-delivery) is kept once
        _write_durably(path, value)
        _write_durably(note, json.dumps({
            "topic": topic, "key": key.decode("utf-8", "replace"), "bytes": len(key) + len(value),
            "sha256": digest, "reason": reason, "quarantined_at_us": time.time_ns() // 1000,
        }, indent=1).encode())
        fsync_dir(self.directory)
        self.count += int(fresh)
        return QuarantinedRecord(path, topic, len(key) + len(value), digest, reason)


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
