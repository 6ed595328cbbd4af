"""Durable delivery of call records: Kafka first, a local write-ahead spool while Kafka is away."""

from producers.delivery.publisher import (
    CallPublisher,
    DeliveryFailed,
    DeliveryReceipt,
    PublisherStats,
    publisher_producer_config,
)
from producers.delivery.spool import RecoveryReport, Spool, SpoolCorrupt, SpoolError, SpoolRecord

__all__ = [
    "CallPublisher",
    "DeliveryFailed",
    "DeliveryReceipt",
    "PublisherStats",
    "RecoveryReport",
    "Spool",
    "SpoolCorrupt",
    "SpoolError",
    "SpoolRecord",
    "publisher_producer_config",
]
