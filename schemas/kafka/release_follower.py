"""A reader's view of one release track: a thread that reads tokentrail.release-decisions from the beginning and
keeps folding it, so the current traffic of the track (serving version, candidate and its fraction, pins) is
always at hand: the gateway routes by it, the trainer resumes from the last good version on a rollback
(docs/release.md). In the contract because both components read it and neither may import the other.

The topic has one partition and a few records a day, so every gateway replica reads all of it, commits
nothing, and ends up with the same fold (``schemas.release_traffic.TrafficLog``, the same sequence rule as
every other reader). A new decision is seen within one poll (``poll_s``). ``caught_up`` is set once the
records that were on the topic at start are folded: routing waits for it, so no call is served by a plan
that is already out of date.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from schemas.codec import DecodeError
from schemas.kafka.config import KafkaSettings, consumer_config
from schemas.kafka.registry_framing import kafka_codec
from schemas.release_traffic import Traffic, TrafficLog
from schemas.topics import RELEASE_DECISIONS_TOPIC

log = logging.getLogger(__name__)
RELEASE_DECISION = "ReleaseDecision"


class ReleaseFollower:
    def __init__(self, kafka: KafkaSettings, model: str, topic: str = RELEASE_DECISIONS_TOPIC,
                 poll_s: float = 0.2, reader: str = "gateway") -> None:
        self.kafka, self.model, self.topic, self.poll_s = kafka, model, topic, poll_s
        self.reader = reader  # names the throwaway consumer group: who reads
        self.caught_up = threading.Event()
        self._log = TrafficLog()
        self._traffic: Traffic | None = None  # replaced whole: readers on other threads see one or the other
        self._applied: tuple[dict[str, Any], ...] = ()  # the track's applied decisions, in order (replaced whole)
        self._read = 0
        self._unreadable: list[str] = []
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="release-follower", daemon=True)

    def start(self) -> ReleaseFollower:
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def traffic(self) -> Traffic | None:
        """The track's traffic now; None while it has no decision (everyone gets the engine's default)."""
        return self._traffic

    def applied(self) -> tuple[dict[str, Any], ...]:
        """The track's decisions that took effect, in topic order (stale and malformed ones left out)."""
        return self._applied

    def status(self) -> dict[str, Any]:
        traffic = self._traffic
        return {"topic": self.topic, "model": self.model, "caught_up": self.caught_up.is_set(),
                "decisions_read": self._read, "stale": self._log.stale, "rejected": len(self._log.rejected),
                "unreadable": len(self._unreadable), "error": self._error,
                "traffic": traffic.as_dict() if traffic is not None else None}

    # ------------------------------------------------------------------------------ the thread
    def _run(self) -> None:
        consumer = Consumer(consumer_config(self.kafka, f"tokentrail-{self.reader}-release-{uuid.uuid4().hex[:12]}"))
        codec = kafka_codec(self.kafka.schema_registry_url)
        try:
            ends = self._assign(consumer)
            while not self._stop.is_set():
                for msg in consumer.consume(100, timeout=self.poll_s):
                    error = msg.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            self._error = str(error)
                        continue
                    self._fold(codec, msg.value(), msg.partition(), msg.offset())
                    if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                        ends.pop(msg.partition(), None)
                if not ends:
                    self.caught_up.set()
        except Exception as exc:  # keep the last plan and say why nothing new arrives
            self._error = f"release follower stopped: {exc!r}"
            log.exception("release follower stopped")
        finally:
            consumer.close()

    def _assign(self, consumer: Consumer) -> dict[int, int]:
        """Assign every partition from its beginning; the end offsets to read up to before caught up."""
        while not self._stop.is_set():
            info = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            if info is not None and info.error is None and info.partitions:
                parts = sorted(info.partitions)
                ends = {p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                        for p in parts}
                consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
                self._error = None
                return {p: end for p, end in ends.items() if end > 0}
            self._error = f"topic {self.topic} does not exist yet"
            time.sleep(1.0)
        return {}

    def _fold(self, codec: Any, value: bytes | None, partition: int, offset: int) -> None:
        try:
            _name, record = codec.decode(value, expect=RELEASE_DECISION, topic=self.topic, partition=partition,
                                         offset=offset)
        except DecodeError as exc:
            self._unreadable.append(str(exc))
            log.warning("skipped an unreadable release decision: %s", exc)
            return
        self._read += 1
        if self._log.add(record) and record.get("model") == self.model:
            self._applied = (*self._applied, record)
            self._traffic = self._log.tracks[self.model]
            log.info("release %s: %s", self.model, self._traffic.as_dict())
