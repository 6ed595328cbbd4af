"""The Confluent wire format through a Schema Registry: the one part of the codec that does I/O.

``kafka_codec(url)`` gives a ``schemas.codec.Codec`` framed through it when a registry URL is set
(``mock://`` gives confluent-kafka's in-process registry, for tests); without one, records use Avro
single-object encoding and no network. The codec only knows the ``RegistryFraming`` protocol, so the
contract does not import this module.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from schemas.codec import (
    CONFLUENT_MAGIC,
    Codec,
    SchemaEntry,
    SchemaStore,
    UnknownFingerprint,
    default_store,
    get_codec,
    schema_entry,
)


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


@lru_cache(maxsize=4)
def kafka_codec(registry_url: str = "") -> Codec:
    """The codec for Kafka records under settings whose Schema Registry URL is ``registry_url`` ("" none)."""
    if not registry_url:
        return get_codec()
    return Codec(registry=ConfluentFraming(registry_url, default_store()))
