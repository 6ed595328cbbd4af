"""What every gateway route shares: settings, the attempt registry, the publisher, the codec and metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from producers.delivery.publisher import RecordQuarantined
from producers.gateway import records
from producers.gateway.attempts import AttemptRegistry
from producers.gateway.body_checks import BodyChecks
from producers.gateway.errors import GatewayError
from producers.gateway.metrics import GatewayMetrics
from producers.gateway.tenants import Tenants
from schemas.codec import Codec
from schemas.kafka.key_store import DEV_MASTER_KEY_HEX
from schemas.sealing import CONTENT_FIELDS
from schemas.subject_names import SubjectNames
from schemas.topics import CALLS_TOPIC, ENV_TOPIC

log = logging.getLogger("tokentrail.gateway")



class RecordPublisher(Protocol):
    """Returns only once the record is on Kafka or fsynced to the local spool; raises otherwise."""

    async def deliver(self, topic: str, key: bytes, value: bytes) -> Any: ...


@dataclass
class GatewayContext:
    registry: AttemptRegistry
    publisher: RecordPublisher
    codec: Codec
    metrics: GatewayMetrics
    admin_key: str = ""
    require_auth: bool = False
    unattributed: str = "record"
    max_body_bytes: int = 8 * 1024 * 1024
    finish_wait_s: float = 30.0
    calls_topic: str = CALLS_TOPIC
    env_topic: str = ENV_TOPIC
    tenants: Tenants = field(default_factory=Tenants)
    # How every route reads its JSON body (large ones checked off the event loop first); default: all on the loop.
    body_checks: BodyChecks = field(default_factory=lambda: BodyChecks(0))
    # What records carry for a subject's name (its keyed pseudonym); default: under the dev master key,
    # create_app gives the deployment's (forget.master_key).
    subjects: SubjectNames = field(default_factory=lambda: SubjectNames(bytes.fromhex(DEV_MASTER_KEY_HEX)))

    @property
    def max_record_bytes(self) -> int | None:
        """The largest record the publisher can ever store (None: no limit known)."""
        return getattr(self.publisher, "max_record_bytes", None)

    async def ready_to_seal(self, schema_name: str, subject: str | None) -> None:
        """Make the data key of ``subject`` in a thread when it has none yet: making one waits for the
        broker to store it (acks=all), which must not stall every other call on the event loop. ``encode``
        then seals from memory. A key that cannot be stored refuses the record (503), as a record that
        cannot be delivered is."""
        sealer = self.codec.sealer
        if not subject or sealer is None or schema_name not in CONTENT_FIELDS:
            return
        has_key = getattr(sealer.keyring, "has_sealing_key", None)
        if has_key is None or has_key(subject):
            return
        try:
            await asyncio.to_thread(sealer.keyring.sealing_key, subject)
        except RuntimeError as exc:
            self.metrics.delivery_errors.labels("subject-keys").inc()
            log.error("could not make the data key of subject %r: %s", subject, exc)
            raise GatewayError(503, f"the {schema_name} record could not be sealed ({exc}); retry later",
                               "unavailable", code="delivery_failed") from exc

    async def encode_ready(self, schema_name: str, record: dict[str, Any], key: str = "") -> bytes:
        """``encode``, the subject's data key made off the event loop first."""
        await self.ready_to_seal(schema_name, record.get("subject"))
        return self.encode(schema_name, record, key)

    def encode(self, schema_name: str, record: dict[str, Any], key: str = "") -> bytes:
        """The record as it goes to Kafka. A record that cannot be encoded, or is too large for Kafka
        ever to take, is refused here, before anything about it changed the gateway's state."""
        try:
            value = self.codec.encode(schema_name, record)
        except (TypeError, ValueError, OverflowError) as exc:
            raise GatewayError(400, f"the {schema_name} record cannot be encoded: {exc}", "invalid_request",
                               code="invalid_record") from exc
        limit = self.max_record_bytes
        if limit is not None and len(value) + len(key.encode()) > limit:
            raise GatewayError(413, f"the {schema_name} record would be {len(value):,} bytes, over the "
                               f"{limit:,} bytes Kafka takes; send less", "invalid_request",
                               code="record_too_large")
        return value

    async def deliver(self, topic: str, key: str, schema_name: str, record: dict[str, Any],
                      value: bytes | None = None) -> bool:
        """Encode (unless ``value`` is given) and hand to the publisher; a publisher failure becomes a 503
        in the caller's protocol.

        True: the record is stored as built. False: Kafka can never take it (its size); it was kept whole
        in the publisher's quarantine and a call record that says so stands in for it on Kafka, so the
        attempt's calls have no hole (the call is not trainable; nothing may splice or delta-encode on it).
        Other records Kafka cannot take are refused with a 413."""
        try:
            await self._deliver(topic, key, schema_name, record, value)
        except RecordQuarantined as exc:
            self.metrics.quarantined.labels(topic).inc()
            if schema_name != "CallRecord":
                raise GatewayError(413, f"the {schema_name} record is too large to store ({exc})",
                                   "invalid_request", code="record_too_large") from exc
            await self._deliver(topic, key, schema_name, records.quarantined_call(record, exc.where), None)
            return False
        return True

    async def _deliver(self, topic: str, key: str, schema_name: str, record: dict[str, Any],
                       value: bytes | None) -> None:
        if value is None:
            await self.ready_to_seal(schema_name, record.get("subject"))
            value = self.codec.encode(schema_name, record)
        began = time.perf_counter()
        try:
            await self.publisher.deliver(topic, key.encode(), value)
        except RecordQuarantined:
            raise
        except Exception as exc:
            self.metrics.delivery_errors.labels(topic).inc()
            log.error("could not deliver %s %s to %s: %s", schema_name, record.get("event_id"), topic, exc)
            raise GatewayError(503, f"the {schema_name} record could not be stored ({exc}); retry later",
                               "unavailable", code="delivery_failed") from exc
        self.metrics.delivery_seconds.observe(time.perf_counter() - began)
