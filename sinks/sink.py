"""The ClickHouse sink: a Kafka consumer group that stores every event of every topic.

At-least-once: offsets are committed only after the rows they produced are inserted (and after any
dead letters they produced are acknowledged by Kafka). A crash between insert and commit re-delivers;
the re-delivered batch carries the same insert deduplication token when its boundaries are the same,
and in any case collapses on the event id in the ReplacingMergeTree.

Undecodable messages (and decodable ones that cannot become rows) become DeadLetter records with the
reason: produced to the dead-letter topic and stored in the dead_letters table.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clickhouse_connect.driver.client import Client
from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from schemas.codec import Codec, DecodeError
from schemas.ids import event_id
from schemas.kafka.config import KafkaSettings
from schemas.kafka.registry_framing import kafka_codec
from schemas.sealing import is_forgotten
from sinks.forget import blank_subject
from sinks.request_bodies import DEFAULT_MEMO_CHARS, RequestBodyDeltas
from sinks.rows import Row, RowError, Source, to_row
from sinks.sample_refs import DEFAULT_MEMO_CALLS, SampleRefs
from sinks.shared_prompts import DEFAULT_MEMO_PROMPTS, Key, SharedPrompts
from sinks.store import encode_samples, insert_rows, inserts_in_order, stored_full_prompts

# Record types each topic may carry (the codec checks the writer schema against these).
TopicMap = dict[str, tuple[str, ...]]
Log = Callable[[str], None]

SINK_STAGE = "sink"
INSERT_ATTEMPTS = 5
# --once normally ends at the partitions' ends; this bounds it if the broker never reports an end.
ONCE_IDLE_S = 30.0


def default_topic_map() -> TopicMap:
    from schemas import topics

    return {spec.name: spec.value_schemas for spec in topics.ALL_TOPICS if spec.sunk}


def default_dead_letter_topic() -> str:
    from schemas import topics

    return topics.DEAD_LETTER_TOPIC


@dataclass
class SinkOptions:
    group_id: str = "tokentrail-clickhouse-sink"
    batch_rows: int = 5_000
    batch_bytes: int = 64 * 1024 * 1024
    flush_interval_s: float = 1.0
    once: bool = False  # stop when every assigned partition is read to its end
    idle_s: float | None = None  # stop after this long without a new message
    max_wait_assignment_s: float = 60.0
    progress_every_s: float = 5.0
    poll_timeout_s: float = 0.2
    request_memo_chars: int = DEFAULT_MEMO_CHARS  # recent request bodies kept as delta bases
    sample_memo_calls: int = DEFAULT_MEMO_CALLS  # recent calls samples may reference (0: samples whole)
    shared_prompt_memo: int = DEFAULT_MEMO_PROMPTS  # stored full prompts later calls may share (0: none)


@dataclass
class SinkStats:
    messages: int = 0
    rows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    dead_letters: int = 0
    batches: int = 0
    commits: int = 0
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        per_table = ", ".join(f"{t} {n}" for t, n in sorted(self.rows.items()) if n)
        return (
            f"sink: {self.messages} messages, {sum(self.rows.values())} rows ({per_table or 'none'}), "
            f"{self.dead_letters} dead letters, {self.batches} batches, "
            f"{self.messages / elapsed:.0f} msg/s"
        )


@dataclass
class _Pending:
    rows: dict[str, list[Row]] = field(default_factory=lambda: defaultdict(list))
    # (topic, partition) -> [first offset, last offset] seen in this batch, per table
    ranges: dict[str, dict[tuple[str, int], list[int]]] = field(default_factory=lambda: defaultdict(dict))
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # next offset to commit
    dead_letters: list[tuple[bytes | None, bytes]] = field(default_factory=list)  # (key, encoded record)
    forgotten: list[str] = field(default_factory=list)  # subjects whose Forgotten event is in this batch
    count: int = 0
    nbytes: int = 0
    since: float = field(default_factory=time.monotonic)


def kafka_time_ms(msg: Message) -> int:
    """The record's Kafka timestamp in ms, -1 where it has none."""
    kind, ms = msg.timestamp()
    return int(ms) if kind != TIMESTAMP_NOT_AVAILABLE and ms >= 0 else -1


def dedup_token(table: str, ranges: dict[tuple[str, int], list[int]]) -> str:
    """Same table and same offset ranges -> same token, so a retried insert is dropped by ClickHouse."""
    spec = ";".join(f"{t}:{p}:{a}-{b}" for (t, p), (a, b) in sorted(ranges.items()))
    return f"{table}:{hashlib.sha256(spec.encode()).hexdigest()[:32]}"


def dead_letter_record(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    error_type: str,
    reason: str,
    timestamp_us: int,
    stage: str = SINK_STAGE,
    subject: str | None = None,
) -> dict[str, Any]:
    """A DeadLetter with a deterministic id (re-delivery of the same bad message gives the same id)."""
    return {
        "event_id": event_id("dead-letter", stage, topic, partition, offset),
        "stage": stage,
        "source_topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key,
        "value": value or b"",
        "error_type": error_type,
        "reason": reason,
        "created_at_us": timestamp_us,
        # Whose content the copy in ``value`` is, when the message could be read (a row it did not fit);
        # a message that could not be decoded has none, as the contract's default says.
        "subject": subject,
        "sealed": None,
    }


class ClickHouseSink:
    def __init__(
        self,
        client: Client,
        kafka: KafkaSettings,
        options: SinkOptions | None = None,
        topic_map: TopicMap | None = None,
        dead_letter_topic: str | None = None,
        codec: Codec | None = None,
        log: Log | None = None,
    ) -> None:
        self.client = client
        self.kafka = kafka
        self.options = options or SinkOptions()
        self.topic_map = topic_map or default_topic_map()
        self.dead_letter_topic = dead_letter_topic or default_dead_letter_topic()
        self.codec = codec or kafka_codec(self.kafka.schema_registry_url)
        self.log: Log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.stats = SinkStats()
        self.pending = _Pending()
        self.request_bodies = RequestBodyDeltas(self.options.request_memo_chars)
        self.sample_refs = SampleRefs(self.options.sample_memo_calls)
        # Holds only prompts of committed inserts, which no rebalance can undo: never reset.
        self.shared_prompts = SharedPrompts(self.options.shared_prompt_memo)
        self.assignment: set[tuple[str, int]] = set()
        self.at_end: set[tuple[str, int]] = set()
        self._broken = False
        self.assigned_at = 0.0
        self.consumer = Consumer(self._consumer_config())
        self.producer = Producer(self._producer_config())

    # ---- configuration ---------------------------------------------------------------------------

    def _consumer_config(self) -> dict[str, Any]:
        from schemas.kafka import config as kafka_config

        # At-least-once: we store and commit offsets ourselves, after the insert.
        return kafka_config.consumer_config(
            self.kafka,
            self.options.group_id,
            # A crashed sink's partitions move to its replacement after 10 s instead of librdkafka's 45 s.
            **{"enable.auto.offset.store": False, "enable.partition.eof": True, "session.timeout.ms": 10_000},
        )

    def _producer_config(self) -> dict[str, Any]:
        from schemas.kafka import config as kafka_config

        return kafka_config.producer_config(self.kafka)

    # ---- main loop -------------------------------------------------------------------------------

    def run(self) -> SinkStats:
        opts = self.options
        self.consumer.subscribe(
            sorted(self.topic_map),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        started = last_message = last_progress = time.monotonic()
        try:
            while True:
                msg = self.consumer.poll(opts.poll_timeout_s)
                now = time.monotonic()
                if msg is not None and self._handle(msg):
                    last_message = now
                if self._should_flush(now):
                    self.flush()
                if opts.progress_every_s and now - last_progress >= opts.progress_every_s:
                    self.log(self.stats.line())
                    last_progress = now
                if self._should_stop(now, started, last_message):
                    break
            self.flush()
        finally:
            self.close()
        self.log(self.stats.line())
        return self.stats

    def _should_stop(self, now: float, started: float, last_message: float) -> bool:
        opts = self.options
        if not self.assignment:
            return (opts.once or opts.idle_s is not None) and now - started > opts.max_wait_assignment_s
        if opts.once and self.assignment <= self.at_end:
            return True
        # Idle time counts from the last message or the last (re)assignment, whichever is later, so a
        # slow group join never ends a run before it has read anything.
        idle_limit = opts.idle_s if opts.idle_s is not None else (ONCE_IDLE_S if opts.once else None)
        return idle_limit is not None and now - max(last_message, self.assigned_at) >= idle_limit

    def _should_flush(self, now: float) -> bool:
        p, opts = self.pending, self.options
        if not p.offsets:
            return False
        return (
            p.count >= opts.batch_rows
            or p.nbytes >= opts.batch_bytes
            or now - p.since >= opts.flush_interval_s
            or (opts.once and self.assignment <= self.at_end)
        )

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned_at = time.monotonic()
        self.assignment |= {(tp.topic, tp.partition) for tp in partitions}

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Store what we have before the partitions move to another member (unless storing just failed:
        # then nothing is committed and the next owner re-reads from the last commit).
        try:
            if not self._broken:
                self.flush()
        finally:
            # Bases are only trusted from partitions read without a break; forget them all.
            self.request_bodies = RequestBodyDeltas(self.options.request_memo_chars)
            self.sample_refs = SampleRefs(self.options.sample_memo_calls)
            gone = {(tp.topic, tp.partition) for tp in partitions}
            self.assignment -= gone
            self.at_end -= gone

    # ---- one message -----------------------------------------------------------------------------

    def _handle(self, msg: Message) -> bool:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                self.at_end.add((msg.topic(), msg.partition()))
                return False
            if err.fatal():
                raise KafkaException(err)
            self.log(f"sink: kafka: {err}")
            return False
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        self.at_end.discard((topic, partition))
        value = msg.value()
        self.stats.messages += 1
        try:
            name, record = self.codec.decode(
                value, expect=self.topic_map.get(topic), topic=topic, partition=partition, offset=offset
            )
            table, row = to_row(name, record, Source(topic, partition, offset, kafka_time_ms(msg)))
            if name == "Forgotten":
                self.pending.forgotten.append(record["subject"])
                if self.codec.sealer is not None:  # the subject's records after this one stay unreadable here
                    self.codec.sealer.forget_keys(list(record.get("key_ids") or ()))
            elif record.get("subject") and is_forgotten(record):
                # Read after its subject's Forgotten event was stored (another topic, a later batch): stored
                # blank but with its content's hashes, so it is blanked again like the rest (a forgotten call's
                # prompt hash becomes its zeros' hash; a sample stops referencing calls).
                self.pending.forgotten.append(record["subject"])
            if table == "calls":
                row = self.request_bodies.encode(row)
                # Stored in this batch or an earlier one, before any sample of this batch (see flush).
                self.sample_refs.note_call(row)
        except DecodeError as exc:
            table, row = self._dead_letter(msg, type(exc).__name__, exc.reason)
        except RowError as exc:  # decoded (``record`` is set), but not a row
            table, row = self._dead_letter(msg, type(exc).__name__, str(exc), record.get("subject"))
        p = self.pending
        p.rows[table].append(row)
        span = p.ranges[table].setdefault((topic, partition), [offset, offset])
        span[0], span[1] = min(span[0], offset), max(span[1], offset)
        p.offsets[(topic, partition)] = offset + 1
        p.count += 1
        p.nbytes += len(value or b"")
        return True

    def _dead_letter(self, msg: Message, error_type: str, reason: str, subject: str | None = None) -> tuple[str, Row]:
        ts_type, ts_ms = msg.timestamp()
        created = ts_ms * 1000 if ts_type and ts_ms > 0 else int(time.time() * 1e6)
        record = dead_letter_record(
            msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), error_type, reason, created,
            subject=subject,
        )
        if msg.topic() != self.dead_letter_topic:  # never loop a bad dead letter back into its own topic
            self.pending.dead_letters.append((msg.key(), self.codec.encode("DeadLetter", record)))
        self.stats.dead_letters += 1
        self.log(f"sink: dead letter {msg.topic()}[{msg.partition()}]@{msg.offset()}: {error_type}: {reason}")
        return to_row("DeadLetter", record, Source(msg.topic(), msg.partition(), msg.offset(), kafka_time_ms(msg)))

    # ---- flush: dead letters acknowledged, rows inserted, then offsets committed ---------------------

    def flush(self) -> None:
        p = self.pending
        if not p.offsets:
            return
        self._broken = True  # until this batch is fully stored and committed
        if p.dead_letters:
            self._produce_dead_letters(p.dead_letters)
        self._encode_samples(p.rows.get("samples", []))
        with self.shared_prompts.storing(p.rows.get("calls", []), self._stored_full_prompts):
            for table in inserts_in_order(p.rows):  # calls before the samples that reference them
                rows = p.rows[table]
                self._insert(table, rows, dedup_token(table, p.ranges[table]))
                self.stats.rows[table] += len(rows)
        for subject in dict.fromkeys(p.forgotten):  # after the inserts: this batch's rows of it go too
            blank_subject(self.client, subject)
            self.log(f"sink: forgot the content of subject {subject!r} in ClickHouse")
        self.consumer.commit(
            offsets=[TopicPartition(t, part, off) for (t, part), off in p.offsets.items()], asynchronous=False
        )
        self.stats.batches += 1
        self.stats.commits += 1
        self.pending = _Pending()
        self._broken = False

    def _encode_samples(self, rows: list[Row]) -> None:
        """Samples reference calls of this batch (inserted first), of earlier batches, or that ClickHouse
        stores already (looked up: another sink or a run before a restart may have stored them)."""
        if not rows or not self.sample_refs.max_calls:
            return
        try:
            encode_samples(self.client, self.sample_refs, rows)
        except Exception as exc:  # a failed look-up: reference only calls this sink stored
            self.log(f"sink: looking up stored calls for samples failed ({exc})")
            encode_samples(None, self.sample_refs, rows)

    def _stored_full_prompts(self, keys: list[Key]) -> dict[Key, str]:
        """Prompts other sinks (or earlier runs) stored; a failed look-up only costs the saving."""
        try:
            return stored_full_prompts(self.client, keys)
        except Exception as exc:
            self.log(f"sink: looking up stored prompts failed ({exc})")
            return {}

    def _insert(self, table: str, rows: list[Row], token: str) -> None:
        delay = 0.5
        for attempt in range(1, INSERT_ATTEMPTS + 1):
            try:
                insert_rows(self.client, table, rows, dedup_token=token)
                return
            except Exception as exc:  # the same token makes the retry safe
                if attempt == INSERT_ATTEMPTS:
                    raise
                self.log(f"sink: insert into {table} failed ({exc}); retry {attempt} in {delay:.1f}s")
                time.sleep(delay)
                delay *= 2

    def _produce_dead_letters(self, letters: list[tuple[bytes | None, bytes]]) -> None:
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(str(err))

        for key, value in letters:
            self.producer.produce(self.dead_letter_topic, value=value, key=key, on_delivery=on_delivery)
        remaining = self.producer.flush(30)
        if remaining or errors:
            raise KafkaException(f"dead letters not acknowledged ({remaining} pending): {errors[:3]}")

    def close(self) -> None:
        try:
            self.consumer.close()
        finally:
            self.producer.flush(10)


def run_sink(
    client: Client, kafka: KafkaSettings, options: SinkOptions | None = None, **kwargs: Any
) -> SinkStats:
    return ClickHouseSink(client, kafka, options, **kwargs).run()
