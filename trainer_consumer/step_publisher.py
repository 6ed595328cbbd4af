"""Kafka producer for what the trainer writes: TrainerStep events and dead letters.

``emit_step`` returns only once the event (and any dead letters queued before it) is acknowledged
by the broker, so the caller may then commit the consumed offsets.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from schemas.codec import Codec, DecodeError, get_codec
from schemas.ids import event_id

STAGE = "trainer"


class StepPublisher:
    def __init__(self, producer_conf: dict[str, Any], steps_topic: str, dead_letter_topic: str,
                 codec: Codec | None = None, flush_timeout_s: float = 30.0) -> None:
        self.producer = Producer(producer_conf)
        self.steps_topic = steps_topic
        self.dead_letter_topic = dead_letter_topic
        self.codec = codec or get_codec()
        self.flush_timeout_s = flush_timeout_s
        self._errors: list[KafkaError] = []

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(err)

    def dead_letter(self, msg: Message, exc: DecodeError) -> None:
        value = msg.value() or b""
        record = {
            "event_id": event_id("dead_letter", STAGE, msg.topic(), msg.partition(), msg.offset()),
            "stage": STAGE,
            "source_topic": msg.topic(),
            "partition": msg.partition(),
            "offset": msg.offset(),
            "key": msg.key(),
            "value": value,
            "error_type": type(exc).__name__,
            "reason": exc.reason,
            "created_at_us": time.time_ns() // 1000,
        }
        self.producer.produce(self.dead_letter_topic, key=msg.key(),
                              value=self.codec.encode("DeadLetter", record), on_delivery=self._on_delivery)

    def emit_step(self, record: dict[str, Any]) -> None:
        self.producer.produce(self.steps_topic, key=record["run_id"].encode(),
                              value=self.codec.encode("TrainerStep", record), on_delivery=self._on_delivery)
        self.flush()

    def flush(self) -> None:
        left = self.producer.flush(self.flush_timeout_s)
        if left:
            reason = f"{left} trainer events not delivered in {self.flush_timeout_s} s"
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, reason))
        if self._errors:
            err, self._errors = self._errors[0], []
            raise KafkaException(err)

    def close(self) -> None:
        self.producer.flush(self.flush_timeout_s)
