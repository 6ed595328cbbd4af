"""The key store of record: every subject's data keys on a compacted Kafka topic, wrapped by the master key.

Each data key is one ``SubjectKey`` record keyed by its key id (``subject#created_us``), its key wrapped
(AES-GCM) by the operator's master key, so the topic (and any backup of it) is useless without the master
key, and the master key alone opens nothing once the data key is gone. Destroying a key is a tombstone under
its key id; compaction then removes the key from the log for good (the topic's configs make that soon).

Every process that seals or opens content holds a ``KafkaKeyStore`` (``schemas.sealing.Keyring``): on first use
it starts a thread of its own that reads the topic from the beginning and then re-reads it every half
``forget.refresh_s``; a thread asking for a key answers from memory and never reads Kafka (the gateway asks on
its event loop). A key it has not seen is waited for: it asks its thread for a re-read that begins after the
question. A new key is on Kafka (flushed, acks=all) before anything sealed under it is written, so a re-read
to the end of the topic sees every key any record it holds was sealed with; a key still absent then was
destroyed (or never existed): its content is forgotten.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import replace

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pydantic import BaseModel, Field, SecretStr

from schemas.codec import Codec, get_codec
from schemas.kafka.config import KafkaSettings, admin_config, consumer_config, producer_config
from schemas.kafka.topic_admin import ensure_topics
from schemas.sealing import KEY_LEN, SealingError, new_data_key, subject_of_key, unwrap_key, wrap_key
from schemas.topics import FORGOTTEN_TOPIC, SUBJECT_KEYS, SUBJECT_KEYS_TOPIC

log = logging.getLogger("tokentrail.keys")

# DEV ONLY. The master key used when the operator supplies none, so demos and tests seal out of the box;
# anyone can read this line, so content sealed under it is protected from nothing but accidents. Production
# sets TOKENTRAIL_FORGET__MASTER_KEY (64 hex characters, from the operator's secret store); a process that
# seals or opens content under this key outside the test suite says so loudly (``warn_dev_master_key``).
DEV_MASTER_KEY_HEX = "d3" * KEY_LEN
DEV_MASTER_KEY_WARNING = (
    "\n" + "!" * 100 + "\n"
    "!! tokentrail forget: content of subjects is sealed under the DEV-ONLY master key, which is public (it is in\n"
    "!! the source). Anyone with a copy of the key topic can open it. For production data set\n"
    "!! TOKENTRAIL_FORGET__MASTER_KEY to 64 hex characters from your secret store (docs/forgetting.md).\n"
    + "!" * 100
)
_dev_key_warned = [False]
_dev_key_warning_lock = threading.Lock()  # key stores' threads and their callers may warn at the same moment


def warn_dev_master_key() -> None:
    """Once per process, outside the test suite (pytest sets PYTEST_CURRENT_TEST for its processes and
    theirs): the loud warning that the public development key is in use."""
    with _dev_key_warning_lock:
        if _dev_key_warned[0] or "PYTEST_CURRENT_TEST" in os.environ:
            return
        _dev_key_warned[0] = True
    log.warning("%s", DEV_MASTER_KEY_WARNING)
    print(DEV_MASTER_KEY_WARNING, file=sys.stderr, flush=True)


class ForgetSettings(BaseModel):
    """Forgetting subjects (docs/forgetting.md); env overrides ``TOKENTRAIL_FORGET__<FIELD>``."""

    # Seal the content of subjects under their keys (records without a subject, synthetic and scripted
    # traffic, are never sealed). On by default: a deployment that takes production data must be able to
    # forget it, and content written in the clear can never be forgotten on the topics. Off: every record is
    # written in the clear (as before issue 31) and a forget can only delete stored copies.
    enabled: bool = True
    master_key: SecretStr = Field(default=SecretStr(DEV_MASTER_KEY_HEX),
                                  description="hex AES-256 key wrapping every data key; the default is dev-only")
    keys_topic: str = SUBJECT_KEYS_TOPIC
    forgotten_topic: str = FORGOTTEN_TOPIC
    # Retention of raw content (a data key's life); None: until forgotten. Per tenant (the part of the
    # subject before its first '/') it may be shorter or longer; non-content facts are kept regardless.
    content_retention_days: float | None = None
    tenant_retention_days: dict[str, float] = Field(default_factory=dict)
    # How far apart the clocks of the processes may be: a key older than the last catch-up by more than
    # this, and absent, is taken as destroyed without asking the broker again.
    clock_skew_s: float = 60.0
    # A process re-reads the key topic at least this often while it opens or seals content, so a key
    # destroyed anywhere stops opening everywhere within this time (the forget command waits it out). The
    # key store's own thread re-reads it every half of this, so a re-read that takes a while still fits.
    refresh_s: float = 1.0
    # When the key store's thread has not read the key topic for this long (the broker is unreachable, or a
    # re-read hangs), opening content waits for a fresh re-read and fails if none comes, rather than go on
    # opening with keys that may have been destroyed meanwhile. Sealing goes on (it opens nothing).
    stale_limit_s: float = 30.0

    def master(self) -> bytes:
        raw = bytes.fromhex(self.master_key.get_secret_value())
        if len(raw) != KEY_LEN:
            raise ValueError(f"forget.master_key must be {KEY_LEN * 2} hex characters (AES-256)")
        return raw

    def uses_dev_master_key(self) -> bool:
        return self.master_key.get_secret_value() == DEV_MASTER_KEY_HEX

    def retention_days(self, subject: str) -> float | None:
        tenant = subject.split("/", 1)[0]
        return self.tenant_retention_days.get(tenant, self.content_retention_days)


def master_key_id(master: bytes) -> str:
    return hashlib.sha256(b"tokentrail master key id\x00" + master).hexdigest()[:16]


def key_created_us(key_id: str) -> int:
    try:
        return int(key_id.rsplit("#", 1)[1])
    except (IndexError, ValueError):
        return 0


class _Minting:
    """A key being made by one thread, which the other threads asking for the same subject wait for."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._made: tuple[str, bytes] | None = None
        self._error: BaseException | None = None

    def done(self, made: tuple[str, bytes]) -> None:
        self._made = made
        self._event.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._event.set()

    def wait(self) -> tuple[str, bytes]:
        if not self._event.wait(60):
            raise RuntimeError("timed out waiting for another thread to store a data key")
        if self._error is not None:
            raise RuntimeError(f"storing the data key failed: {self._error}") from self._error
        assert self._made is not None
        return self._made


class _Rereads:
    """What a key store's re-reading thread shares with the threads that wait for a re-read (under ``cond``)."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.asked = 0  # re-reads asked for, numbered
        self.served = 0  # the newest number a finished re-read began after
        self.error: BaseException | None = None  # the last re-read's failure; None when it succeeded
        self.read_once = False
        self.caught_up_at_us = 0  # when the last successful re-read began
        self.count = 0


def _reread(ref: weakref.ref[KafkaKeyStore], state: _Rereads, stop: threading.Event, period_s: float) -> None:
    """A key store's thread: re-read its topic every ``period_s``, and at once when a thread asks; until
    ``stop``, or until nobody holds the store any more."""
    consumer: Consumer | None = None
    next_offset, next_at = 0, 0.0
    try:
        while True:
            with state.cond:
                while not stop.is_set() and state.served >= state.asked and time.monotonic() < next_at:
                    state.cond.wait(min(next_at - time.monotonic(), 1.0))
                    if ref() is None:
                        return
                if stop.is_set():
                    return
                number = state.asked
            store = ref()
            if store is None:
                return
            began, began_us = time.monotonic(), store._now_us()
            error: BaseException | None = None
            try:
                if consumer is None:
                    consumer = store._new_consumer()
                next_offset = store._read_to_end(consumer, next_offset)
            except Exception as exc:  # the broker is away or slow: the waiters hear it, the thread goes on
                error = exc
                log.warning("key topic %s: re-read failed: %s", store.topic, exc)
            del store
            with state.cond:
                state.count += 1
                state.error = error
                if error is None:
                    state.read_once, state.caught_up_at_us = True, began_us
                state.served = max(state.served, number)
                state.cond.notify_all()
            next_at = began + period_s
    finally:
        if consumer is not None:
            consumer.close()
        with state.cond:  # nobody waits for a re-read that will not come
            if state.served < state.asked:
                state.error = RuntimeError("the key store was closed")
                state.served = state.asked
            state.cond.notify_all()


class KafkaKeyStore:
    """``schemas.sealing.Keyring`` over the compacted key topic; thread-safe. Its own thread (started on first
    use, stopped by ``close``) is the only one that reads the topic: asking for a key never reads Kafka."""

    def __init__(self, kafka: KafkaSettings, settings: ForgetSettings, *, codec: Codec | None = None,
                 now_us: Callable[[], int] = lambda: time.time_ns() // 1000) -> None:
        self.kafka, self.settings = kafka, settings
        self.topic = settings.keys_topic
        self._master = settings.master()
        self._master_id = master_key_id(self._master)
        self._dev_key = settings.uses_dev_master_key()
        self._codec = codec or get_codec()
        self._now_us = now_us
        self._lock = threading.RLock()  # the keys below; never held while Kafka is read or written
        self._keys: dict[str, bytes] = {}
        self._expires: dict[str, int | None] = {}
        self._current: dict[str, str] = {}  # subject -> its newest key id
        self._destroyed: set[str] = set()
        self._minting: dict[str, _Minting] = {}  # subject -> the key being made for it by some thread
        # subject -> when this process last saw one of its keys destroyed (unix us): content it opened
        # before then must not be used any more (the trainer checks before every step).
        self.destroyed_at: dict[str, int] = {}
        self._producer: Producer | None = None
        # The re-reading thread (it holds the store only weakly: a store nobody holds stops its thread).
        self._rereads = _Rereads()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._pid = 0

    @property
    def catch_ups(self) -> int:
        """How many times this store has read the key topic to its end."""
        return self._rereads.count

    # ---- Keyring ----------------------------------------------------------------------------------
    def sealing_key(self, subject: str) -> tuple[str, bytes]:
        self._ready()
        with self._lock:
            usable = self._usable(subject)
            if usable is not None:
                return usable
            minting = self._minting.get(subject)
            mine = minting is None
            if mine:
                minting = self._minting[subject] = _Minting()
        assert minting is not None
        if not mine:  # another thread is making this subject's key: wait for it, not for the lock
            return minting.wait()
        try:
            made = self._mint(subject)
        except BaseException as exc:
            minting.fail(exc)
            raise
        finally:
            with self._lock:
                del self._minting[subject]
        minting.done(made)
        return made

    def has_sealing_key(self, subject: str) -> bool:
        """Whether ``sealing_key(subject)`` can answer from memory, without making a key (which waits for
        the broker): callers on an event loop make the key in a thread first (``producers.gateway``)."""
        with self._lock:
            return self._rereads.read_once and self._usable(subject) is not None

    def opening_key(self, key_id: str) -> bytes | None:
        self._ready()
        if self._now_us() - self._rereads.caught_up_at_us > self.settings.stale_limit_s * 1e6:
            self._await_read()  # the thread has not read the topic for too long: no key opens on old news
        with self._lock:
            key = self._keys.get(key_id)
            if key is not None or key_id in self._destroyed:
                return key
            skew_us = int(self.settings.clock_skew_s * 1e6)
            if key_created_us(key_id) < self._rereads.caught_up_at_us - skew_us:
                return None  # absent at a re-read long after it was made: destroyed (compacted away)
        self._await_read()  # made since the last re-read (by another process): the next re-read has it
        with self._lock:
            return self._keys.get(key_id)

    # ---- destroying ------------------------------------------------------------------------------
    def key_ids(self, subject: str) -> list[str]:
        self._await_read()
        with self._lock:
            return sorted(k for k in self._keys if subject_of_key(k) == subject)

    def destroy(self, subject: str) -> list[str]:
        """Tombstone every key of ``subject`` (flushed before this returns); the key ids destroyed."""
        gone = self.key_ids(subject)
        self._tombstone(gone)
        return gone

    def expire(self) -> list[str]:
        """Tombstone every key whose retention ran out; the key ids destroyed."""
        self._await_read()
        with self._lock:
            now = self._now_us()
            gone = sorted(k for k, at in self._expires.items() if at is not None and at <= now and k in self._keys)
        self._tombstone(gone)
        return gone

    def forget_keys(self, key_ids: list[str]) -> None:
        """Known destroyed (a Forgotten event names them), ahead of the tombstones' next re-read."""
        with self._lock:
            for key_id in key_ids:
                self._forget_locally(key_id)

    def close(self) -> None:
        """Stop the re-reading thread (it closes its consumer) and flush what was produced."""
        with self._rereads.cond:
            self._stop.set()
            thread, self._thread = self._thread, None
            self._rereads.cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(30)
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(10)

    def refresh(self) -> None:
        """Wait for a re-read of the key topic that begins after this call (the trainer waits before each
        step: no forgotten key trains)."""
        self._await_read()

    # ---- the re-reading thread ---------------------------------------------------------------------
    def _ready(self) -> None:
        """The thread runs and has read the topic to its end once (a process's first use waits for that)."""
        self._start()
        if not self._rereads.read_once:
            self._await_read()

    def _start(self) -> None:
        with self._rereads.cond:
            if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
                return
            if self._pid not in (0, os.getpid()):
                self._producer = None  # a forked child: its parent's Kafka clients are not its own
            self._pid = os.getpid()
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=_reread, args=(weakref.ref(self), self._rereads, self._stop, self.settings.refresh_s / 2),
                daemon=True, name=f"tokentrail-keys:{self.topic}")
            self._thread.start()

    def _await_read(self) -> None:
        """Ask the thread for a re-read and wait until one that began after the asking is done."""
        self._start()
        state = self._rereads
        with state.cond:
            state.asked += 1
            number = state.asked
            state.cond.notify_all()
            if not state.cond.wait_for(lambda: state.served >= number, timeout=60):
                raise RuntimeError(f"the key topic {self.topic} was not read in 60 s")
            error = state.error
        if error is not None:
            raise RuntimeError(f"the key topic {self.topic} could not be read: {error}") from error

    def _new_consumer(self) -> Consumer:
        self._ensure_topic()
        consumer = Consumer(consumer_config(self.kafka, f"tokentrail-keys-{uuid.uuid4().hex[:12]}",
                                            **{"enable.partition.eof": False}))
        consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        return consumer

    def _read_to_end(self, consumer: Consumer, next_offset: int) -> int:
        """Fold the topic from ``next_offset`` up to its current end into the keys; the offset after it."""
        _low, end = consumer.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=10, cached=False)
        deadline = time.monotonic() + 30
        while next_offset < end:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the key topic {self.topic} could not be read to offset {end}")
            folds = []
            # Ask for no more than are left: consume() waits its whole timeout for as many as it asks for.
            for msg in consumer.consume(min(500, end - next_offset), timeout=0.5):
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("key topic: %s", error)
                    continue
                folds.append(self._parse(msg.key(), msg.value()))
                next_offset = msg.offset() + 1
            with self._lock:
                for fold in folds:
                    if fold is not None:
                        self._fold(*fold)
        return next_offset

    # ---- plumbing --------------------------------------------------------------------------------
    def _tombstone(self, key_ids: list[str]) -> None:
        if not key_ids:
            return
        producer = self._producer_()
        errors: list[str] = []
        for key_id in key_ids:
            producer.produce(self.topic, key=key_id.encode(), value=None,
                             on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
        self._flush(producer, errors, "tombstones")
        with self._lock:
            for key_id in key_ids:
                self._forget_locally(key_id)

    def _warn_if_dev_key(self) -> None:
        if self._dev_key:
            warn_dev_master_key()

    def _usable(self, subject: str) -> tuple[str, bytes] | None:
        key_id = self._current.get(subject)
        expires = self._expires.get(key_id) if key_id else None
        if key_id is not None and key_id in self._keys and (expires is None or expires > self._now_us()):
            return key_id, self._keys[key_id]
        return None

    def _mint(self, subject: str) -> tuple[str, bytes]:
        """A new data key of ``subject``, on the broker before it is used. Called without the lock held:
        the flush takes a broker round trip, during which other subjects' keys keep being served."""
        self._warn_if_dev_key()
        now = self._now_us()
        key_id = f"{subject}#{now}"
        data_key = new_data_key()
        days = self.settings.retention_days(subject)
        expires = None if days is None else now + int(days * 86_400e6)
        record = {"key_id": key_id, "subject": subject, "wrapped_key": wrap_key(self._master, key_id, data_key),
                  "master_key_id": self._master_id, "created_at_us": now, "expires_at_us": expires}
        producer = self._producer_()
        delivered = threading.Event()
        errors: list[str] = []

        def on_delivery(err: object, _msg: object) -> None:
            if err:
                errors.append(str(err))
            delivered.set()

        producer.produce(self.topic, key=key_id.encode(), value=self._codec.encode("SubjectKey", record),
                         on_delivery=on_delivery)
        # Wait for this record only (flush() would also wait for other threads' records); poll() serves
        # the delivery callbacks of whichever thread's records are done.
        deadline = time.monotonic() + 30
        while not delivered.is_set() and time.monotonic() < deadline:
            producer.poll(0.05)
        if errors or not delivered.is_set():
            raise RuntimeError(f"could not store the data key of {subject!r} on the key topic: "
                               f"{errors or 'not delivered in 30 s'}")
        with self._lock:
            self._keys[key_id], self._expires[key_id] = data_key, expires
            if key_created_us(self._current.get(subject, "")) <= now:
                self._current[subject] = key_id
        return key_id, data_key

    @staticmethod
    def _flush(producer: Producer, errors: list[str], what: str) -> None:
        left = producer.flush(30)
        if left or errors:
            raise RuntimeError(f"could not store {what} on the key topic: {errors or f'{left} unsent'}")

    def _forget_locally(self, key_id: str) -> None:
        self._keys.pop(key_id, None)
        self._expires.pop(key_id, None)
        self._destroyed.add(key_id)
        subject = subject_of_key(key_id)
        self.destroyed_at[subject] = self._now_us()
        if self._current.get(subject) == key_id:
            del self._current[subject]

    def _producer_(self) -> Producer:
        with self._lock:
            if self._producer is not None:
                return self._producer
        self._ensure_topic()  # a broker round trip: not under the lock
        producer = Producer(producer_config(self.kafka, **{"linger.ms": 0}))
        with self._lock:
            if self._producer is None:
                self._producer = producer
            return self._producer

    def _ensure_topic(self) -> None:
        admin = AdminClient(admin_config(self.kafka))
        ensure_topics(admin, self.kafka, (replace(SUBJECT_KEYS, name=self.topic),))

    def _parse(self, key: bytes | None, value: bytes | None) -> tuple[str, bytes | None, int | None, str] | None:
        """One record of the key topic as (key id, data key or None for a tombstone, expiry, subject); None
        for one this process cannot use. Decoding and unwrapping happen outside the lock."""
        if key is None:
            return None
        key_id = key.decode()
        if value is None:
            return key_id, None, None, subject_of_key(key_id)
        _, record = self._codec.decode(value, expect="SubjectKey", topic=self.topic)
        if record["master_key_id"] != self._master_id:
            log.error("data key %s is wrapped by master key %s, not this one (%s): its content stays sealed",
                      key_id, record["master_key_id"], self._master_id)
            return None
        try:
            data_key = unwrap_key(self._master, key_id, record["wrapped_key"])
        except SealingError as exc:
            log.error("%s", exc)
            return None
        self._warn_if_dev_key()
        return key_id, data_key, record.get("expires_at_us"), record["subject"]

    def _fold(self, key_id: str, data_key: bytes | None, expires: int | None, subject: str) -> None:
        """Under the lock: one parsed record of the key topic into the keys."""
        if data_key is None:
            self._forget_locally(key_id)
            return
        self._destroyed.discard(key_id)
        self._keys[key_id], self._expires[key_id] = data_key, expires
        if key_created_us(self._current.get(subject, "")) <= key_created_us(key_id):
            self._current[subject] = key_id
