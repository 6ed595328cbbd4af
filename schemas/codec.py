"""Avro encoding of every event, framed so a reader knows the writer schema.

Default framing is Avro single-object encoding: ``C3 01`` + the writer schema's CRC-64-AVRO
fingerprint (8 bytes, little-endian) + the schemaless body. Writer schemas are resolved against the
schemas kept in this folder (current ones and ``history/`` for older versions), and the body is read
into the current reader schema with fastavro's schema resolution. Given a ``RegistryFraming`` the
Confluent wire format (``00`` + 4-byte schema id + body) is used instead; the one that talks to a Schema
Registry is ``schemas.kafka.registry_framing`` (``kafka_codec(url)``), so the codec itself does no I/O.

Content of subjects is sealed on encode and opened on decode by the process's ``Sealer``
(``schemas/sealing.py``; the shell installs one with ``install_sealer`` when forgetting is on), so every
producer and consumer reads what it may without knowing about it. Records without a subject pass as they are.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from schemas.sealing import CONTENT_FIELDS, Sealer

SCHEMA_DIR = Path(__file__).resolve().parent
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
HEADER_LEN = 10

Record = dict[str, Any]


class DecodeError(ValueError):
    """A record that cannot be decoded; names where it came from so it can be dead-lettered."""

    def __init__(self, reason: str, topic: str | None = None, partition: int | None = None,
                 offset: int | None = None) -> None:
        self.reason = reason
        self.topic, self.partition, self.offset = topic, partition, offset
        where = f" at {topic}[{partition}]@{offset}" if topic is not None else ""
        super().__init__(f"{type(self).__name__}{where}: {reason}")


class CorruptRecord(DecodeError):
    pass


class UnknownFingerprint(DecodeError):
    pass


class TruncatedPayload(DecodeError):
    pass


class SchemaMismatch(DecodeError):
    """The writer schema is known but is not the one the caller expected on this topic."""


@dataclass(frozen=True)
class SchemaEntry:
    name: str  # short record name, e.g. "CallRecord"
    raw: dict[str, Any]
    parsed: dict[str, Any]
    canonical: str
    fingerprint: bytes  # 8 bytes, little-endian CRC-64-AVRO


def schema_entry(raw: dict[str, Any]) -> SchemaEntry:
    parsed = parse_schema(raw)  # keeps the "parsed" hint: fastavro then skips re-parsing per call
    canonical = to_parsing_canonical_form(raw)
    fp = bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    return SchemaEntry(raw["name"], raw, parsed, canonical, fp)


class SchemaStore:
    """Current schemas by name, and every known writer schema by fingerprint."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR) -> None:
        self.current: dict[str, SchemaEntry] = {}
        self.by_fingerprint: dict[bytes, SchemaEntry] = {}
        for path in sorted(schema_dir.glob("*.avsc")):
            entry = schema_entry(json.loads(path.read_text()))
            self.current[entry.name] = entry
            self.by_fingerprint[entry.fingerprint] = entry
        for path in sorted((schema_dir / "history").glob("*.avsc")):
            entry = schema_entry(json.loads(path.read_text()))
            self.by_fingerprint.setdefault(entry.fingerprint, entry)

    def schema(self, name: str) -> SchemaEntry:
        try:
            return self.current[name]
        except KeyError:
            raise KeyError(f"no schema named {name!r}; known: {sorted(self.current)}") from None


@lru_cache(maxsize=1)
def default_store() -> SchemaStore:
    return SchemaStore()


class RegistryFraming(Protocol):
    """Schema ids from a registry in place of fingerprints (Confluent wire format: ``00`` + 4-byte id)."""

    def header(self, entry: SchemaEntry) -> bytes: ...

    def writer(self, schema_id: int, where: dict[str, Any]) -> SchemaEntry: ...


_PROCESS_SEALER: list[Sealer | None] = [None]


def install_sealer(sealer: Sealer | None) -> Sealer | None:
    """Make ``sealer`` the one every codec of this process without its own uses; returns the previous one."""
    previous, _PROCESS_SEALER[0] = _PROCESS_SEALER[0], sealer
    return previous


def process_sealer() -> Sealer | None:
    return _PROCESS_SEALER[0]


class Codec:
    """Encode and decode events. One instance per process; thread-safe for reads."""

    def __init__(self, store: SchemaStore | None = None, registry: RegistryFraming | None = None,
                 sealer: Sealer | None = None) -> None:
        self.store = store or default_store()
        self._registry = registry
        self._sealer = sealer

    @property
    def sealer(self) -> Sealer | None:
        return self._sealer if self._sealer is not None else _PROCESS_SEALER[0]

    def encode(self, name: str, record: Record) -> bytes:
        entry = self.store.schema(name)
        if record.get("subject") and name in CONTENT_FIELDS and record.get("sealed") is None:
            sealer = self.sealer
            if sealer is not None:
                record = sealer.seal(name, record)
        buf = io.BytesIO()
        if self._registry is not None:
            buf.write(self._registry.header(entry))
        else:
            buf.write(SINGLE_OBJECT_MAGIC)
            buf.write(entry.fingerprint)
        fastavro.schemaless_writer(buf, entry.parsed, record)
        return buf.getvalue()

    def decode(self, data: bytes, *, expect: str | tuple[str, ...] | None = None, topic: str | None = None,
               partition: int | None = None, offset: int | None = None,
               open_sealed: bool = True) -> tuple[str, Record]:
        """Decode one framed record into the current schema of its name; returns (name, record).
        ``open_sealed=False`` leaves sealed content sealed (no key looked up): for reading facts only."""
        where = {"topic": topic, "partition": partition, "offset": offset}
        if data is None or len(data) < 1:
            raise TruncatedPayload("empty payload", **where)
        if data[:2] == SINGLE_OBJECT_MAGIC:
            if len(data) < HEADER_LEN:
                raise TruncatedPayload(f"{len(data)} bytes is shorter than the 10-byte header", **where)
            writer = self.store.by_fingerprint.get(bytes(data[2:HEADER_LEN]))
            if writer is None:
                raise UnknownFingerprint(f"writer schema fingerprint {bytes(data[2:10]).hex()} is not "
                                         "among the schemas in schemas/ or schemas/history/", **where)
            body_start = HEADER_LEN
        elif data[:1] == CONFLUENT_MAGIC and self._registry is not None:
            if len(data) < 5:
                raise TruncatedPayload("shorter than the 5-byte Confluent header", **where)
            writer = self._registry.writer(int.from_bytes(data[1:5], "big"), where)
            body_start = 5
        else:
            raise CorruptRecord(f"unknown framing (first bytes {bytes(data[:2]).hex()})", **where)
        if expect is not None:
            names = (expect,) if isinstance(expect, str) else expect
            if writer.name not in names:
                raise SchemaMismatch(f"expected {'/'.join(names)}, got {writer.name}", **where)
        reader = self.store.current.get(writer.name, writer)
        reader_schema = None if reader is writer else reader.parsed  # resolve only across versions
        buf = io.BytesIO(data)
        buf.seek(body_start)
        try:
            record = fastavro.schemaless_reader(buf, writer.parsed, reader_schema)
        except (EOFError, StopIteration, IndexError) as exc:  # fastavro reads past the end
            raise TruncatedPayload(f"body ends early while reading {writer.name}: {exc!r}", **where) from exc
        except Exception as exc:  # fastavro raises assorted errors on garbage
            raise CorruptRecord(f"cannot read {writer.name} body: {exc!r}", **where) from exc
        if buf.tell() != len(data):
            raise CorruptRecord(f"{len(data) - buf.tell()} trailing bytes after the {writer.name} body",
                                **where)
        if open_sealed and record.get("sealed") is not None:
            sealer = self.sealer
            if sealer is not None:
                try:
                    record = sealer.open(writer.name, record)
                except ValueError as exc:  # SealingError: a tampered or misplaced envelope
                    raise CorruptRecord(str(exc), **where) from exc
        return writer.name, record


@lru_cache(maxsize=1)
def get_codec() -> Codec:
    """The process's codec with single-object framing (no registry); ``schemas.kafka.registry_framing.
    kafka_codec`` gives the one that follows the Kafka settings' registry URL."""
    return Codec()
