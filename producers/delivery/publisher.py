"""Durable delivery of records to Kafka, with a local write-ahead spool while Kafka is unreachable.

``await publisher.deliver(topic, key, value)`` returns only when the record is safe: acknowledged by Kafka
(acks=all, idempotent producer) or appended and fsynced to the spool. Order per key is kept:

* a record goes to Kafka directly only while the spool is empty, so a record never overtakes one
  that was spooled before it;
* a rollout's calls are sequential (the harness waits for call i before it makes call i+1, and the
  gateway answers call i only after ``deliver`` returned), so per-key order follows from the above;
* the drainer sends spooled records in sequence order through the same idempotent producer (which
  keeps order per partition) and moves the spool cursor only past acknowledged records.

No duplicates within a process's lifetime: librdkafka never gives up on a record
(``message.timeout.ms=0``) and its idempotent retries are deduplicated by the broker, even across a
broker restart. When a direct delivery outlasts ``delivery_timeout_s`` the record is spooled for
durability, but the original stays in librdkafka; the drainer then waits for that original's verdict
instead of sending a second copy. Only a crash of this process between such a spool append and the
original's acknowledgement can leave a second copy on Kafka (the next process re-sends the spool);
it carries the same deterministic event id and consumers deduplicate on it.

Never blocked by one record: a record Kafka can never take (over the producer's size limit, or refused
by the broker for its size or as invalid) is not spooled or retried but quarantined (``quarantine.py``)
and reported to the caller as ``RecordQuarantined``; one found in the spool (left by an earlier version,
or refused by the broker after it was spooled) is quarantined by the drainer, which goes on with the next.

Threads: one librdkafka poll thread (delivery callbacks are batched onto the event loop) and one
spool I/O thread (group-committed appends, reads, cursor writes). No per-call threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from producers.delivery.quarantine import Quarantine, QuarantinedRecord
from producers.delivery.spool import Spool, SpoolRecord

if TYPE_CHECKING:
    from producers.gateway.settings import GatewaySettings
    from schemas.kafka.config import KafkaSettings

log = logging.getLogger(__name__)

Ack = tuple[int, int]  # partition, offset
# topic, key, value, the caller's future for its spool sequence, the original still in librdkafka
_PendingAppend = tuple[str, bytes, bytes, "asyncio.Future[int]", "asyncio.Future[Ack] | None"]


class DeliveryFailed(RuntimeError):
    """The record is neither on Kafka nor in the spool (e.g. the spool disk is full)."""


class RecordQuarantined(DeliveryFailed):
    """Kafka can never take this record; it is kept whole in the quarantine folder instead (``where``)."""

    def __init__(self, where: QuarantinedRecord) -> None:
        super().__init__(f"{where.reason}; the record ({where.size:,} bytes) is kept in {where.path}")
        self.where = where


class KafkaDeliveryError(RuntimeError):
    """Kafka refused one record (internal). ``permanent``: no retry can succeed (quarantined); otherwise
    the record goes to the spool and is retried."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class DeliveryReceipt:
    topic: str
    spooled: bool  # True: in the local spool, reaching Kafka later
    partition: int | None = None  # set when Kafka acknowledged directly
    offset: int | None = None
    spool_seq: int | None = None  # set when spooled
    latency_ms: float = 0.0


@dataclass(frozen=True)
class PublisherStats:
    delivered_direct: int  # acknowledged by Kafka on the direct path
    spooled: int  # appended to the spool (counted once each)
    drained: int  # spooled records (this run's and any left by an earlier one) acknowledged by Kafka
    delivery_errors: int  # direct deliveries that failed or timed out, and failed drain batches
    spool_depth: int  # records waiting in the spool (including appends in flight)
    spool_bytes: int
    kafka_reachable: bool
    quarantined: int = 0  # records Kafka can never take, kept in the quarantine folder (ever, not this run)


# Measured here (local broker, 24 kB records): linger 1 ms gave 2.3-3.4 ms median delivery at
# concurrency 1, linger 0 gave 0.7 ms, with the same throughput at 64 in flight (batches form while
# earlier requests are in flight).
MAX_LINGER_MS = 0.0
ZSTD_LEVEL = 1
# Errors no retry can fix: the record is quarantined instead of blocking the ones behind it.
PERMANENT_ERRORS = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
                              KafkaError.INVALID_RECORD})
# Headroom under message.max.bytes for what the broker adds around a record (batch and record headers).
RECORD_OVERHEAD_BYTES = 512
# Settings the delivery guarantees depend on; they override whatever the base config says.
REQUIRED_PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "compression.type": "zstd",
    # Never give up on a record: retries of the same record are deduplicated by the broker, so
    # waiting is how a record reaches Kafka exactly once. The publisher's own timeout decides spooling.
    "message.timeout.ms": 0,
}


def publisher_producer_config(base: dict[str, Any]) -> dict[str, Any]:
    """The producer config of the publisher: ``base`` (bootstrap, security, sizes) + the guarantees."""
    conf = dict(base)
    conf.update(REQUIRED_PRODUCER_CONFIG)
    # Every call waits for its acknowledgement, so lingering is pure added latency.
    conf["linger.ms"] = min(float(conf.get("linger.ms", MAX_LINGER_MS)), MAX_LINGER_MS)
    # librdkafka makes a fresh zstd context per batch; at the default level 3 clearing its tables cost as
    # much as compressing (gateway bench: 0.4 ms of producer-thread CPU a call at level 3, 0.2 ms at
    # level 1, for records ~5% larger).
    conf.setdefault("compression.level", ZSTD_LEVEL)
    conf.setdefault("reconnect.backoff.max.ms", 1000)  # notice a returning broker quickly
    return conf


class _LibrdkafkaLog:
    """librdkafka's log lines (connection refused while a broker is away...) at debug level.

    The publisher reports Kafka trouble through its counters and a warning when spooling begins.
    """

    def __init__(self) -> None:
        self._log = logging.getLogger("tokentrail.kafka.librdkafka")

    def log(self, level: int, msg: str, *args: object) -> None:
        self._log.debug(msg, *args)


class CallPublisher:
    """Kafka producer + write-ahead spool + drainer. Start with ``await start()``; ``await close()``."""

    def __init__(
        self,
        producer_config: dict[str, Any],
        spool_dir: Path | str,
        delivery_timeout_s: float = 5.0,
        *,
        drain_batch_records: int = 500,
        drain_batch_bytes: int = 8 * 1024 * 1024,
        segment_bytes: int = 64 * 1024 * 1024,
        producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
    ) -> None:
        self.delivery_timeout_s = delivery_timeout_s
        self._producer_config = publisher_producer_config(producer_config)
        self._producer_config["error_cb"] = self._on_client_error
        self._producer_config["logger"] = _LibrdkafkaLog()
        self._producer_factory = producer_factory
        self._spool_dir = Path(spool_dir)
        self.quarantine = Quarantine(self._spool_dir / "quarantine")
        # The largest key + value Kafka takes (librdkafka refuses larger ones before sending).
        self.max_record_bytes = int(self._producer_config.get("message.max.bytes", 1_000_000)) \
            - RECORD_OVERHEAD_BYTES
        self._segment_bytes = segment_bytes
        self._drain_batch_records = drain_batch_records
        self._drain_batch_bytes = drain_batch_bytes

        self._producer: Producer | None = None
        self._spool: Spool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokentrail-spool")
        self._poll_thread: threading.Thread | None = None
        self._stop_polling = threading.Event()
        self._drainer: asyncio.Task[None] | None = None
        self._drain_wakeup = asyncio.Event()
        self._closing = False

        # Delivery callbacks arrive on the poll thread; they are handed to the loop in batches.
        self._completions: deque[tuple[asyncio.Future[Ack], KafkaError | None, int, int]] = deque()
        self._completion_lock = threading.Lock()
        self._wakeup_scheduled = False

        # Group commit: appends queued while the previous fsync runs are written together.
        self._append_queue: list[_PendingAppend] = []
        self._appending = 0
        self._flushing = False
        # Records the drainer may read: appended, and their shadows (below) registered.
        self._visible_seq = 0
        # Spooled records whose original is still in librdkafka: its verdict decides, not a re-send.
        self._shadows: dict[int, asyncio.Future[Ack]] = {}
        # Spooled records below this sequence are on Kafka (or quarantined), even if the cursor is not yet.
        self._acked_upto = 0

        self._kafka_down = False
        self._delivered_direct = 0
        self._spooled = 0
        self._cursor_at_start = 0
        self._delivery_errors = 0

    @classmethod
    def from_settings(cls, kafka: KafkaSettings, gateway: GatewaySettings) -> CallPublisher:
        """The gateway's publisher: schemas.kafka.config.producer_config, the gateway's spool dir and timeout."""
        from schemas.kafka.config import producer_config

        return cls(producer_config(kafka), gateway.spool_dir, gateway.delivery_timeout_s)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._spool = await self._loop.run_in_executor(self._io, Spool, self._spool_dir, self._segment_bytes)
        self._cursor_at_start = self._spool.cursor
        self._visible_seq = self._spool.next_seq
        if self._spool.recovery.pending:
            log.warning(
                "spool %s holds %d undelivered records from an earlier run; draining them first",
                self._spool_dir, self._spool.recovery.pending,
            )
        self._producer = self._producer_factory(self._producer_config)
        self._poll_thread = threading.Thread(
            target=self._poll_loop, name="tokentrail-kafka-poll", daemon=True
        )
        self._poll_thread.start()
        self._drainer = asyncio.create_task(self._drain_loop(), name="tokentrail-spool-drainer")

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop draining, give records in flight up to ``timeout_s``, keep the rest spooled."""
        if self._closing:
            return
        self._closing = True
        if self._drainer is not None:
            self._drainer.cancel()
            try:
                await self._drainer
            except asyncio.CancelledError:
                pass
        while self._flushing:  # spool appends in progress finish first
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        if self._producer is not None:
            await loop.run_in_executor(None, self._producer.flush, timeout_s)
        self._stop_polling.set()
        if self._poll_thread is not None:
            await loop.run_in_executor(None, self._poll_thread.join)
        self._resolve_completions()
        if self._spool is not None:
            # Spooled records whose originals were acknowledged meanwhile need no re-send next time.
            upto = max(self._spool.cursor, self._acked_upto)
            while upto < self._visible_seq and self._succeeded(self._shadows.get(upto)):
                upto += 1
            await loop.run_in_executor(self._io, self._spool.ack, upto)
            await loop.run_in_executor(self._io, self._spool.close)
        self._io.shutdown(wait=True)

    async def __aenter__(self) -> CallPublisher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ the one call

    async def deliver(self, topic: str, key: bytes, value: bytes) -> DeliveryReceipt:
        """Return once the record is acknowledged by Kafka or durably spooled; raise DeliveryFailed else."""
        if self._producer is None or self._closing:
            raise DeliveryFailed("the publisher is not started (or already closed)")
        began = time.perf_counter()
        size = len(key) + len(value)
        if size > self.max_record_bytes:
            await self._quarantine(topic, key, value, f"the record is {size:,} bytes, over Kafka's limit of "
                                   f"{self.max_record_bytes:,}")
        if not self._spool_is_empty() or self._kafka_down:
            return await self._spool_record(topic, key, value, began, None)
        original = self._submit(topic, key, value)
        try:
            async with asyncio.timeout(self.delivery_timeout_s):
                partition, offset = await asyncio.shield(original)
        except TimeoutError:
            self._delivery_errors += 1
            if self._spool_is_empty():
                log.warning("no Kafka acknowledgement within %.1f s; spooling", self.delivery_timeout_s)
            return await self._spool_record(topic, key, value, began, original)
        except KafkaDeliveryError as exc:
            self._delivery_errors += 1
            if exc.permanent:
                await self._quarantine(topic, key, value, f"Kafka refused the record for good: {exc}")
            log.warning("Kafka refused a record for %s (%s); spooling it", topic, exc)
            return await self._spool_record(topic, key, value, began, None)
        self._delivered_direct += 1
        return DeliveryReceipt(topic, False, partition, offset, None, (time.perf_counter() - began) * 1000)

    def _spool_is_empty(self) -> bool:
        assert self._spool is not None
        return self._spool.pending == 0 and self._appending == 0

    async def wait_drained(self, timeout_s: float) -> bool:
        """True once the spool is empty (everything spooled reached Kafka) within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self._spool_is_empty():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    # ------------------------------------------------------------------ metrics

    @property
    def spool_depth(self) -> int:
        return (self._spool.pending if self._spool else 0) + self._appending

    def stats(self) -> PublisherStats:
        return PublisherStats(
            delivered_direct=self._delivered_direct,
            spooled=self._spooled,
            # From the durable cursor, so it agrees with spool_depth at every instant.
            drained=(self._spool.cursor - self._cursor_at_start) if self._spool else 0,
            delivery_errors=self._delivery_errors,
            spool_depth=self.spool_depth,
            spool_bytes=self._spool.pending_bytes if self._spool else 0,
            kafka_reachable=not self._kafka_down,
            quarantined=self.quarantine.count,
        )

    async def _quarantine(self, topic: str, key: bytes, value: bytes, reason: str) -> None:
        """Keep a record Kafka can never take, then raise RecordQuarantined (nothing is spooled)."""
        assert self._loop is not None
        where = await self._loop.run_in_executor(self._io, self.quarantine.put, topic, key, value, reason)
        log.error("quarantined a %s record (%d bytes, key %r): %s; kept in %s", topic, where.size,
                  key.decode("utf-8", "replace"), reason, where.path)
        raise RecordQuarantined(where)

    # ------------------------------------------------------------------ Kafka

    def _submit(self, topic: str, key: bytes, value: bytes) -> asyncio.Future[Ack]:
        assert self._loop is not None and self._producer is not None
        future: asyncio.Future[Ack] = self._loop.create_future()
        try:
            self._producer.produce(
                topic, value, key, on_delivery=lambda err, msg: self._on_delivery(future, err, msg)
            )
        except BufferError as exc:  # local queue full: later
            future.set_exception(KafkaDeliveryError(str(exc)))
        except KafkaException as exc:  # e.g. larger than message.max.bytes: never
            code = exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else None
            future.set_exception(KafkaDeliveryError(str(exc), permanent=code in PERMANENT_ERRORS))
        return future

    def _on_delivery(self, future: asyncio.Future[Ack], err: KafkaError | None, msg: Message) -> None:
        # Poll thread. Wake the loop once per batch of callbacks, not once per record.
        self._completions.append((future, err, msg.partition() or 0, msg.offset() or 0))
        with self._completion_lock:
            if self._wakeup_scheduled:
                return
            self._wakeup_scheduled = True
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._resolve_completions)
        except RuntimeError:  # loop closed during shutdown; nobody waits any more
            pass

    def _resolve_completions(self) -> None:
        with self._completion_lock:
            self._wakeup_scheduled = False  # cleared before draining, so no completion is stranded
        while self._completions:
            future, err, partition, offset = self._completions.popleft()
            if future.done():
                continue
            if err is None:
                self._kafka_down = False
                future.set_result((partition, offset))
            else:
                future.set_exception(KafkaDeliveryError(err.str(), permanent=err.code() in PERMANENT_ERRORS))

    @staticmethod
    def _refused_for_good(future: asyncio.Future[Ack]) -> bool:
        exc = future.exception() if future.done() and not future.cancelled() else None
        return isinstance(exc, KafkaDeliveryError) and exc.permanent

    @staticmethod
    def _succeeded(future: asyncio.Future[Ack] | None) -> bool:
        return future is not None and future.done() and not future.cancelled() and future.exception() is None

    def _on_client_error(self, err: KafkaError) -> None:
        # Poll thread. "All brokers down": spool at once instead of waiting out the timeout.
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self._kafka_down = True
        log.debug("kafka client error: %s", err)

    def _poll_loop(self) -> None:
        assert self._producer is not None
        while not self._stop_polling.is_set():
            self._producer.poll(0.05)

    # ------------------------------------------------------------------ spool (group commit)

    async def _spool_record(
        self, topic: str, key: bytes, value: bytes, began: float, original: asyncio.Future[Ack] | None
    ) -> DeliveryReceipt:
        assert self._loop is not None
        future: asyncio.Future[int] = self._loop.create_future()
        self._append_queue.append((topic, key, value, future, original))
        self._appending += 1
        if not self._flushing:
            self._flushing = True
            self._loop.create_task(self._flush_appends())
        seq = await future
        self._spooled += 1
        return DeliveryReceipt(topic, True, None, None, seq, (time.perf_counter() - began) * 1000)

    async def _flush_appends(self) -> None:
        assert self._loop is not None and self._spool is not None
        try:
            while self._append_queue:
                batch, self._append_queue = self._append_queue, []
                try:
                    items = [(topic, key, value) for topic, key, value, _, _ in batch]
                    seqs = await self._loop.run_in_executor(self._io, self._spool.append_batch, items)
                except Exception as exc:
                    log.error("spool append failed: %s", exc)
                    failure = DeliveryFailed(f"Kafka unreachable and spool append failed: {exc}")
                    for _, _, _, future, _ in batch:
                        future.set_exception(failure)
                else:
                    for (_, _, _, future, original), seq in zip(batch, seqs, strict=True):
                        if original is not None:
                            self._shadows[seq] = original
                        future.set_result(seq)
                    self._visible_seq = seqs[-1] + 1
                finally:
                    self._appending -= len(batch)
                self._drain_wakeup.set()
        finally:
            self._flushing = False

    # ------------------------------------------------------------------ drainer

    def _drain_future(self, record: SpoolRecord) -> asyncio.Future[Ack]:
        """The original's future while it is pending or acknowledged; else a fresh send."""
        original = self._shadows.get(record.seq)
        if original is not None and (not original.done() or self._succeeded(original)):
            return original
        if original is not None and not original.cancelled():
            original.exception()  # retrieved: a refused original is replaced by a fresh send
        self._shadows.pop(record.seq, None)
        return self._submit(record.topic, record.key, record.value)

    async def _drain_loop(self) -> None:
        """Drain until cancelled. A failure of one round (a read, a quarantine write, a cursor write on a
        full disk) is logged and retried after a backoff; the drainer never dies silently."""
        backoff = 0.1
        while True:
            try:
                if await self._drain_round():
                    backoff = 0.1
                    continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._delivery_errors += 1
                log.error("spool drainer: %s; retrying in %.1f s", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _drain_round(self) -> bool:
        """Send the next batch of spooled records; True when every one of them was settled."""
        assert self._loop is not None and self._spool is not None
        # Kafka may have acknowledged records whose cursor write failed: those are not sent again.
        start = max(self._spool.cursor, self._acked_upto)
        if start > self._spool.cursor:
            await self._loop.run_in_executor(self._io, self._spool.ack, start)
        if start >= self._visible_seq:
            self._drain_wakeup.clear()
            if max(self._spool.cursor, self._acked_upto) >= self._visible_seq:
                await self._drain_wakeup.wait()
            return True
        records = await self._loop.run_in_executor(
            self._io, self._spool.read, start, self._drain_batch_records, self._drain_batch_bytes,
        )
        records = [r for r in records if r.seq < self._visible_seq]
        if not records:
            return True
        # The whole batch goes to the producer at once, in order; the idempotent producer keeps
        # that order per partition and retries until Kafka takes each record.
        futures = [self._drain_future(r) for r in records]
        await asyncio.wait(futures)
        acked = 0
        try:
            for record, future in zip(records, futures, strict=True):
                if not self._succeeded(future):
                    if not self._refused_for_good(future):
                        break
                    # Left by an earlier run or refused by the broker: kept aside, never blocking the rest.
                    where = await self._loop.run_in_executor(
                        self._io, self.quarantine.put, record.topic, record.key, record.value,
                        f"Kafka refused the spooled record for good: {future.exception()}")
                    log.error("quarantined spooled record %d for %s (%d bytes): kept in %s", record.seq,
                              record.topic, where.size, where.path)
                acked += 1
        finally:
            for record, future in zip(records[acked:], futures[acked:], strict=True):
                if self._succeeded(future):  # already on Kafka: the next round waits on it, no second copy
                    self._shadows[record.seq] = future
                elif future.done() and not future.cancelled():
                    future.exception()  # retrieved: the record is sent again in the next round
            if acked:
                self._acked_upto = records[acked - 1].seq + 1
                for record in records[:acked]:
                    self._shadows.pop(record.seq, None)
        await self._loop.run_in_executor(self._io, self._spool.ack, self._acked_upto)
        if self._spool.pending == 0:
            log.info("spool drained: every spooled record is on Kafka")
        if acked < len(records):
            self._delivery_errors += 1
            log.warning("Kafka refused a spooled record (%s); retrying", futures[acked].exception())
            return False
        return True
