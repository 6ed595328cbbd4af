"""Committed encoded fixtures: one per writer schema version, read by every later version.

``tokentrail schemas fixtures`` (tokentrail/commands/schemas.py) writes
``tests/fixtures/avro/<Name>-<fingerprint>.bin`` for each current schema that has none yet. Before
changing a schema, copy its current .avsc into ``schemas/history/`` (so old data keeps resolving),
change it, then run the command again.
"""

from __future__ import annotations

from pathlib import Path

from schemas.codec import Codec, get_codec
from schemas.examples import example_record

FIXTURE_DIR = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "avro"


def fixture_path(name: str, fingerprint: bytes, directory: Path = FIXTURE_DIR) -> Path:
    return directory / f"{name}-{fingerprint.hex()}.bin"


def write_missing_fixtures(codec: Codec | None = None, directory: Path = FIXTURE_DIR) -> list[Path]:
    codec = codec or get_codec()
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, entry in sorted(codec.store.current.items()):
        path = fixture_path(name, entry.fingerprint, directory)
        if not path.exists():
            path.write_bytes(codec.encode(name, example_record(entry.raw)))
            written.append(path)
    return written
