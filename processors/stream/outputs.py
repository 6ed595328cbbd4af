"""What the agents produce: records encoded for their topics, sent and acknowledged; dead letters.

Keys and values stay bytes on every topic of the app: the codec encodes and decodes them (and
dead-letters what it cannot decode).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import faust

from processors.dead_letters import dead_letter, subject_of
from processors.errors import InvalidEvent, ProcessorError
from processors.stream.topics import StreamTopics, partition_for, record_key
from schemas.codec import Codec, DecodeError

log = logging.getLogger("tokentrail.processors")

Record = dict[str, Any]
Encoded = tuple[str, bytes, bytes]  # (topic, key, value)

# Keys and values stay bytes: the codec decodes them (and dead-letters what it cannot decode).
RAW_TOPIC: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                             "value_serializer": "raw"}
# Bad input never stops a worker: these become a DeadLetter on tokentrail.dead-letter with the reason.
BAD_INPUT = (DecodeError, ProcessorError)


class Outputs:
    """Encodes output records and produces them where confluent-kafka would place their keys."""

    def __init__(self, app: faust.App, codec: Codec, topics: StreamTopics, partitions: dict[str, int],
                 n_partitions: int, stats: Counter[str], max_record_bytes: int | None = None) -> None:
        self.app = app
        self.codec = codec
        self.topics = topics
        self.partitions = partitions  # topic name -> its partition count
        self.n_partitions = n_partitions  # for a topic not in ``partitions``
        self.stats = stats
        self.max_record_bytes = max_record_bytes  # the largest key + value Kafka takes
        self._out: dict[str, faust.TopicT] = {}

    def _topic(self, name: str) -> faust.TopicT:
        if name not in self._out:
            self._out[name] = self.app.topic(name, **RAW_TOPIC)
        return self._out[name]

    async def send(self, items: list[Encoded]) -> None:
        """Produce, then wait until the broker acknowledged every message."""
        futures = []
        for topic, key, value in items:
            partition = partition_for(key, self.partitions.get(topic, self.n_partitions))
            futures.append(await self._topic(topic).send(key=key, value=value, partition=partition, force=True))
        if futures:
            await asyncio.gather(*futures)

    def encode(self, records: list[tuple[str, Record]]) -> list[Encoded]:
        """Encode every output first, so a record that does not fit its schema sends nothing."""
        out = []
        for name, record in records:
            try:
                value = self.codec.encode(name, record)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise InvalidEvent(f"output {name} {record.get('event_id')} does not fit its schema: "
                                   f"{exc!r}") from exc
            key = record_key(name, record).encode()
            if self.max_record_bytes is not None and len(key) + len(value) > self.max_record_bytes:
                raise InvalidEvent(f"output {name} {record.get('event_id')} is {len(value):,} bytes, over the "
                                   f"{self.max_record_bytes:,} Kafka takes")
            out.append((self.topics.output(name), key, value))
            self.stats[f"out.{name}"] += 1
        return out

    async def dead_letter(self, stage: str, message: Any, error: BaseException | str) -> None:
        record = dead_letter(stage=stage, source_topic=message.topic, partition=message.partition,
                             offset=message.offset, key=message.key, value=message.value, error=error,
                             created_at_us=round(message.timestamp * 1000) * 1000,
                             subject=subject_of(self.codec, message.value))
        key = message.key or b""
        topic = self.topics.dead_letter
        n = self.partitions.get(topic, self.n_partitions)
        partition = partition_for(key, n) if key else message.partition % n
        value = self.codec.encode("DeadLetter", record)
        if self.max_record_bytes is not None and len(value) + len(key) > self.max_record_bytes:
            # A copy of an input as large as Kafka allows no longer fits beside the reason: the letter
            # points at the input's place instead (the input topic keeps it).
            record = dict(record, value=b"", reason=f"{record['reason'][:4000]} [the {len(message.value or b''):,}"
                          f"-byte value is not copied: read it at {message.topic}[{message.partition}]"
                          f"@{message.offset}]")
            value = self.codec.encode("DeadLetter", record)
        future = await self._topic(topic).send(key=message.key, value=value, partition=partition, force=True)
        await future
        self.stats[f"dead_letter.{stage}"] += 1
        log.warning("dead-lettered %s[%s]@%s (%s): %s", message.topic, message.partition, message.offset,
                    record["error_type"], record["reason"][:300])
