"""The Confluent wire format through a Schema Registry: the one part of the codec that does I/O.

``schemas.codec.Codec`` uses it when a registry URL is set (``mock://`` gives confluent-kafka's
in-process registry, for tests); without one, records use Avro single-object encoding and no network.
"""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from schemas.codec import CONFLUENT_MAGIC, SchemaEntry, SchemaStore, UnknownFingerprint, schema_entry


class ConfluentFraming:
    """Confluent wire format through a Schema Registry (``mock://`` works in-process for tests)."""

    def __init__(self, url: str, store: SchemaStore) -> None:
        self.client = SchemaRegistryClient.new_client({"url": url})  # mock:// gives the in-process registry
        self.store = store
        self._ids: dict[str, int] = {}
        self._writers: dict[int, SchemaEntry] = {}

    def header(self, entry: SchemaEntry) -> bytes:
        schema_id = self._ids.get(entry.name)
        if schema_id is None:
            subject = f"dev.tokentrail.{entry.name}"
            schema_id = self.client.register_schema(subject, Schema(entry.canonical, "AVRO"))
            self._ids[entry.name] = schema_id
            self._writers[schema_id] = entry
        return CONFLUENT_MAGIC + schema_id.to_bytes(4, "big")

    def writer(self, schema_id: int, where: dict[str, Any]) -> SchemaEntry:
        entry = self._writers.get(schema_id)
        if entry is None:
            try:
                schema = self.client.get_schema(schema_id)
            except Exception as exc:
                raise UnknownFingerprint(f"schema id {schema_id} unknown to the registry: {exc}",
                                         **where) from exc
            entry = schema_entry(json.loads(schema.schema_str))
            self._writers[schema_id] = entry
        return entry
