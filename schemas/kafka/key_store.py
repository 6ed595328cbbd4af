"""The key store of record: every subject's data keys on a compacted Kafka topic, wrapped by the master key.

Each data key is one ``SubjectKey`` record keyed by its key id (``subject#created_us``), its key wrapped
(AES-GCM) by the operator's master key, so the topic (and any backup of it) is useless without the master
key, and the master key alone opens nothing once the data key is gone. Destroying a key is a tombstone under
its key id; compaction then removes the key from the log for good (the topic's configs make that soon).

Every process that seals or opens content holds a ``KafkaKeyStore`` (``schemas.sealing.Keyring``): it reads
the topic from the beginning on first use and catches up again when asked for a key it has not seen. A new
key is on Kafka (flushed, acks=all) before anything sealed under it is written, so a reader that catches up
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


def warn_dev_master_key() -> None:
    """Once per process, outside the test suite (pytest sets PYTEST_CURRENT_TEST for its processes and
    theirs): the loud warning that the public development key is in use."""
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
    # destroyed anywhere stops opening everywhere within this time (the forget command waits it out).
    refresh_s: float = 1.0

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


class KafkaKeyStore:
    """``schemas.sealing.Keyring`` over the compacted key topic; thread-safe."""

    def __init__(self, kafka: KafkaSettings, settings: ForgetSettings, *, codec: Codec | None = None,
                 now_us: Callable[[], int] = lambda: time.time_ns() // 1000) -> None:
        self.kafka, self.settings = kafka, settings
        self.topic = settings.keys_topic
        self._master = settings.master()
        self._master_id = master_key_id(self._master)
        self._dev_key = settings.uses_dev_master_key()
        self._codec = codec or get_codec()
        self._now_us = now_us
        self._lock = threading.RLock()
        self._keys: dict[str, bytes] = {}
        self._expires: dict[str, int | None] = {}
        self._current: dict[str, str] = {}  # subject -> its newest key id
        self._destroyed: set[str] = set()
        self._minting: dict[str, _Minting] = {}  # subject -> the key being made for it by some thread
        # subject -> when this process last saw one of its keys destroyed (unix us): content it opened
        # before then must not be used any more (the trainer checks before every step).
        self.destroyed_at: dict[str, int] = {}
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._next_offset = 0
        self._caught_up_at_us = 0  # when the last catch-up began
        self.catch_ups = 0

    # ---- Keyring ----------------------------------------------------------------------------------
    def sealing_key(self, subject: str) -> tuple[str, bytes]:
        with self._lock:
            self._refresh_if_stale()
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
            return self._usable(subject) is not None

    def opening_key(self, key_id: str) -> bytes | None:
        with self._lock:
            self._refresh_if_stale()
            key = self._keys.get(key_id)
            if key is not None or key_id in self._destroyed:
                return key
            skew_us = int(self.settings.clock_skew_s * 1e6)
            if self._consumer is not None and key_created_us(key_id) < self._caught_up_at_us - skew_us:
                return None  # absent at a catch-up long after it was made: destroyed (compacted away)
            self._catch_up()
            return self._keys.get(key_id)

    # ---- destroying ------------------------------------------------------------------------------
    def key_ids(self, subject: str) -> list[str]:
        with self._lock:
            self._catch_up()
            return sorted(k for k in self._keys if subject_of_key(k) == subject)

    def destroy(self, subject: str) -> list[str]:
        """Tombstone every key of ``subject`` (flushed before this returns); the key ids destroyed."""
        with self._lock:
            gone = self.key_ids(subject)
            self._tombstone(gone)
            return gone

    def expire(self) -> list[str]:
        """Tombstone every key whose retention ran out; the key ids destroyed."""
        with self._lock:
            self._catch_up()
            now = self._now_us()
            gone = sorted(k for k, at in self._expires.items() if at is not None and at <= now and k in self._keys)
            self._tombstone(gone)
            return gone

    def forget_keys(self, key_ids: list[str]) -> None:
        """Known destroyed (a Forgotten event names them), ahead of the tombstones' next catch-up."""
        with self._lock:
            for key_id in key_ids:
                self._forget_locally(key_id)

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
            if self._producer is not None:
                self._producer.flush(10)
                self._producer = None

    def refresh(self) -> None:
        """Catch up with the key topic now (the trainer does before each step: no forgotten key trains)."""
        with self._lock:
            self._catch_up()

    # ---- plumbing --------------------------------------------------------------------------------
    def _refresh_if_stale(self) -> None:
        if self._consumer is None or self._now_us() - self._caught_up_at_us > self.settings.refresh_s * 1e6:
            self._catch_up()
    def _tombstone(self, key_ids: list[str]) -> None:
        if not key_ids:
            return
        producer = self._producer_()
        errors: list[str] = []
        for key_id in key_ids:
            producer.produce(self.topic, key=key_id.encode(), value=None,
                             on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
        self._flush(producer, errors, "tombstones")
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
        with self._lock:
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
        if self._producer is None:
            self._ensure_topic()
            self._producer = Producer(producer_config(self.kafka, **{"linger.ms": 0}))
        return self._producer

    def _ensure_topic(self) -> None:
        admin = AdminClient(admin_config(self.kafka))
        ensure_topics(admin, self.kafka, (replace(SUBJECT_KEYS, name=self.topic),))

    def _catch_up(self) -> None:
        """Read the key topic up to its current end."""
        self.catch_ups += 1
        started = self._now_us()
        tp = TopicPartition(self.topic, 0)
        if self._consumer is None:
            self._ensure_topic()
            self._consumer = Consumer(consumer_config(self.kafka, f"tokentrail-keys-{uuid.uuid4().hex[:12]}",
                                                      **{"enable.partition.eof": False}))
            self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        _low, end = self._consumer.get_watermark_offsets(tp, timeout=10, cached=False)
        deadline = time.monotonic() + 30
        while self._next_offset < end:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the key topic {self.topic} could not be read to offset {end}")
            for msg in self._consumer.consume(500, timeout=0.5):
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("key topic: %s", error)
                    continue
                self._fold(msg.key(), msg.value())
                self._next_offset = msg.offset() + 1
        self._caught_up_at_us = started

    def _fold(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        key_id = key.decode()
        if value is None:
            self._forget_locally(key_id)
            return
        _, record = self._codec.decode(value, expect="SubjectKey", topic=self.topic)
        if record["master_key_id"] != self._master_id:
            log.error("data key %s is wrapped by master key %s, not this one (%s): its content stays sealed",
                      key_id, record["master_key_id"], self._master_id)
            return
        try:
            data_key = unwrap_key(self._master, key_id, record["wrapped_key"])
        except SealingError as exc:
            log.error("%s", exc)
            return
        self._warn_if_dev_key()
        self._destroyed.discard(key_id)
        self._keys[key_id], self._expires[key_id] = data_key, record.get("expires_at_us")
        subject = record["subject"]
        if key_created_us(self._current.get(subject, "")) <= key_created_us(key_id):
            self._current[subject] = key_id
