"""The delivery tests' own broker: they stop and restart it, so it is not the shared one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tokentrail.settings import KafkaSettings

from .kafka_helpers import PrivateBroker, free_port


@pytest.fixture(scope="session")
def private_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateBroker]:
    """A second single-node broker on its own ports and data dir (the shared one is left alone)."""
    settings = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        controller_port=free_port(),
        data_dir=Path(tmp_path_factory.mktemp("private-kafka")),
        heap="512m",
    )
    broker = PrivateBroker(settings)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
