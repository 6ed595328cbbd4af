"""Durable delivery of call records: Kafka first, a local write-ahead spool while Kafka is away, and a
quarantine folder for the records Kafka can never take."""

from producers.delivery.publisher import (
    CallPublisher,
    DeliveryFailed,
    DeliveryReceipt,
    PublisherStats,
    RecordQuarantined,
    publisher_producer_config,
)
from producers.delivery.quarantine import Quarantine, QuarantinedRecord
from producers.delivery.spool import RecoveryReport, Spool, SpoolCorrupt, SpoolError, SpoolRecord

__all__ = [
    "CallPublisher",
    "DeliveryFailed",
    "DeliveryReceipt",
    "PublisherStats",
    "Quarantine",
    "QuarantinedRecord",
    "RecordQuarantined",
    "RecoveryReport",
    "Spool",
    "SpoolCorrupt",
    "SpoolError",
    "SpoolRecord",
    "publisher_producer_config",
]
