"""Durable delivery of call records: Kafka first, a local write-ahead spool while Kafka is away."""

from producers.delivery.sink import (
    DeliveryFailed,
    DeliveryReceipt,
    KafkaCallSink,
    SinkStats,
    sink_producer_config,
)
from producers.delivery.spool import RecoveryReport, Spool, SpoolCorrupt, SpoolError, SpoolRecord

__all__ = [
    "DeliveryFailed",
    "DeliveryReceipt",
    "KafkaCallSink",
    "RecoveryReport",
    "SinkStats",
    "Spool",
    "SpoolCorrupt",
    "SpoolError",
    "SpoolRecord",
    "sink_producer_config",
]
