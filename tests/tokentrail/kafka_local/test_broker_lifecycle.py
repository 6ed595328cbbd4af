"""Start, status, idempotent start and stop of the real local broker."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from tokentrail import kafka_local
from tokentrail.settings import KafkaSettings

pytestmark = pytest.mark.e2e


def _run(argv: list[str]) -> int:
    """This area's commands through argparse, without importing every CLI module."""
    parser = argparse.ArgumentParser(prog="tokentrail")
    subparsers = parser.add_subparsers()
    kafka_local.register(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_shared_broker_answers(kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["kafka", "status"]) == 0
    assert f"answering on {kafka_bootstrap}" in capsys.readouterr().out


@pytest.mark.kafka
def test_lifecycle_of_a_private_broker(tmp_path: Path) -> None:
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{_free_port()}", controller_port=_free_port(),
                          data_dir=tmp_path / "kafka", heap="512m")
    said: list[str] = []
    assert not kafka_local.status(kafka).running
    try:
        first = kafka_local.start(wait_s=120, kafka=kafka, echo=said.append)
        assert first.running and first.answering and first.pid is not None
        assert (tmp_path / "kafka" / "broker.pid").read_text().strip() == str(first.pid)
        assert any("formatting" in line for line in said)
        meta = (tmp_path / "kafka" / "data" / "meta.properties").read_text()

        said.clear()
        again = kafka_local.start(wait_s=30, kafka=kafka, echo=said.append)
        assert again.pid == first.pid
        assert any("already running" in line for line in said)

        assert kafka_local.stop(kafka=kafka, echo=said.append) is True
        stopped = kafka_local.status(kafka)
        assert not stopped.running and not stopped.answering
        assert not (tmp_path / "kafka" / "broker.pid").exists()
        server_log = (tmp_path / "kafka" / "logs" / "server.log").read_text()
        assert "Transition from SHUTTING_DOWN to SHUTDOWN" in server_log  # a controlled shutdown
        assert kafka_local.cds_archive(kafka).exists()  # left by this or an earlier clean stop

        # A restart reuses the formatted storage (same cluster id), no second format.
        said.clear()
        restarted = kafka_local.start(wait_s=120, kafka=kafka, echo=said.append)
        assert restarted.answering and restarted.pid != first.pid
        assert not any("formatting" in line for line in said)
        assert (tmp_path / "kafka" / "data" / "meta.properties").read_text() == meta
    finally:
        kafka_local.stop(kafka=kafka, echo=said.append)
    assert kafka_local.stop(kafka=kafka, echo=said.append) is False


def test_port_held_by_something_else_is_refused(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}", controller_port=_free_port(),
                              data_dir=tmp_path)
        with pytest.raises(kafka_local.KafkaLocalError, match="not a Kafka broker"):
            kafka_local.start(wait_s=5, kafka=kafka, echo=lambda _: None)
