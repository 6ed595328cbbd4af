"""Kafka security settings reach every client: a private broker whose only client listener is
SASL_PLAINTEXT with PLAIN users, reached by the admin client, a producer and a consumer, and a faust
processors worker, all configured from settings.kafka alone; wrong credentials fail fast and say why.

The shared broker on 9092 is never touched: this broker has its own free ports and data dir.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from schemas.kafka.config import admin_config, consumer_config, producer_config
from schemas.kafka.topic_admin import ensure_topics
from schemas.topics import ALL_TOPICS, CALLS_TOPIC
from tests.processors.stream.stream_rig import StreamRig, comparable, group_events, interleave, make_rig
from tokentrail import kafka_local
from tokentrail.runtime.process import start_worker_process, stop_worker_process
from tokentrail.settings import KafkaSettings, Settings, get_settings

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

USERS = {"broker": "broker-secret", "alice": "alice-secret"}
ALICE = {"sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-secret"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def with_kafka(settings: Settings, **changes: object) -> Settings:
    return settings.model_copy(update={"kafka": settings.kafka.model_copy(update=changes)})


@pytest.fixture(scope="module")
def sasl_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Settings whose Kafka section points at a private SASL/PLAIN broker, started here."""
    base = get_settings()
    kafka = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{free_port()}", controller_port=free_port(),
        data_dir=tmp_path_factory.mktemp("sasl-kafka"), lib_dir=base.kafka.lib_dir, heap="512m", partitions=2,
        security_protocol="SASL_PLAINTEXT", extra_client_config=ALICE,
        broker_properties=kafka_local.plain_sasl_broker_properties(USERS, broker_user="broker"),
    )
    kafka_local.start(wait_s=180, kafka=kafka, echo=lambda _: None)  # ready = answers alice over SASL
    try:
        yield base.model_copy(update={"kafka": kafka})
    finally:
        kafka_local.stop(timeout_s=60, kafka=kafka, echo=lambda _: None)


def test_the_broker_only_lets_sasl_users_in(sasl_settings: Settings) -> None:
    kafka = sasl_settings.kafka
    props = (Path(kafka.data_dir) / "server.properties").read_text().splitlines()
    assert f"listeners=SASL_PLAINTEXT://{kafka.bootstrap_servers},CONTROLLER://127.0.0.1:{kafka.controller_port}" \
        in props
    assert kafka_local.broker_answers(kafka)
    assert not kafka_local.broker_answers(kafka.model_copy(update={"security_protocol": "PLAINTEXT",
                                                                    "extra_client_config": {}}))


def test_admin_producer_and_consumer_use_the_credentials(sasl_settings: Settings) -> None:
    report = ensure_topics(AdminClient(admin_config(sasl_settings.kafka)), sasl_settings.kafka)
    assert report.ok, report.differences
    assert set(report.created) | set(report.existing) == {spec.name for spec in ALL_TOPICS}

    producer = Producer(producer_config(sasl_settings.kafka))
    sent = [(f"r{i % 3}".encode(), f"value-{i}".encode()) for i in range(30)]
    for key, value in sent:
        producer.produce(CALLS_TOPIC, key=key, value=value)
    assert producer.flush(30) == 0

    consumer = Consumer(consumer_config(sasl_settings.kafka, f"sasl-{uuid.uuid4().hex[:8]}"))
    try:
        partitions = consumer.list_topics(CALLS_TOPIC, timeout=30).topics[CALLS_TOPIC].partitions
        consumer.assign([TopicPartition(CALLS_TOPIC, p, OFFSET_BEGINNING) for p in partitions])
        got: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + 60
        while len(got) < len(sent) and time.monotonic() < deadline:
            got += [(m.key(), m.value()) for m in consumer.consume(100, timeout=0.5) if not m.error()]
    finally:
        consumer.close()
    assert sorted(got) == sorted(sent)


def test_a_faust_worker_processes_a_workload_over_sasl(sasl_settings: Settings, tmp_path: Path) -> None:
    rig: StreamRig = make_rig(sasl_settings, tmp_path)  # topics created by the admin client over SASL
    try:
        events = interleave(group_events("gs", ["The answer is 4", "5", "4"], seed=11), seed=3)
        expected = rig.expected(events)
        assert len(expected["RolloutGroup"]) == 1 and len(expected["Sample"]) == 9
        rig.produce(events)
        rig.start_worker()
        got = rig.collect(lambda c: all(set(expected[n]) <= c.ids(n) for n in expected), timeout_s=120)
        got = rig.settle(quiet_s=2.0)
        for name, records in expected.items():
            assert got.ids(name) == set(records), name
            for record in got.records[name]:
                assert comparable(name, record) == comparable(name, records[record["event_id"]]), name
        assert rig.stop_all() == [0]
        log = rig.log_path.read_text(errors="replace")
        assert "SaslAuthenticationFailed" not in log
    finally:
        rig.close()


def test_wrong_credentials_fail_fast_with_a_clear_error(sasl_settings: Settings, tmp_path: Path) -> None:
    wrong = with_kafka(sasl_settings, extra_client_config={**ALICE, "sasl.password": "not-her-password"})

    # confluent-kafka admin (topics, the worker's start-up check): the broker's refusal, within seconds.
    code, message, seconds = _ensure_topics_refusal(wrong)
    assert code == KafkaError._AUTHENTICATION and "Authentication failed" in message, message
    assert seconds < 15
    assert not kafka_local.broker_answers(wrong.kafka)

    # The processors worker refuses to start, naming the cause, instead of waiting for a broker.
    log = tmp_path / "worker.log"
    worker = start_worker_process(wrong, log_path=log, extra_args=["--app-id", f"sasl-wrong-{uuid.uuid4().hex[:6]}"])
    try:
        assert worker.wait(60) == 2
    finally:
        stop_worker_process(worker)
    assert "Authentication failed" in log.read_text(errors="replace")

    # faust's own client (aiokafka) gets the same credentials, and is refused just as clearly.
    assert "SaslAuthenticationFailed" in asyncio.run(_aiokafka_start(wrong))
    assert asyncio.run(_aiokafka_start(sasl_settings)) == "started"


def _ensure_topics_refusal(settings: Settings) -> tuple[int, str, float]:
    """(error code, message, seconds) of ensure_topics failing; the exception is not kept alive, so the
    admin client it refers to is gone before the broker stops."""
    began = time.monotonic()
    try:
        ensure_topics(AdminClient(admin_config(settings.kafka)), settings.kafka)
    except KafkaException as exc:
        return exc.args[0].code(), str(exc), time.monotonic() - began
    return 0, "accepted", time.monotonic() - began


async def _aiokafka_start(settings: Settings) -> str:
    """Start an aiokafka producer with exactly the options the faust app gets; what happened."""
    import logging

    import aiokafka
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from schemas.kafka.config import faust_app_settings

    auth = credentials_to_aiokafka_auth(faust_app_settings(settings.kafka)["broker_credentials"])
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("aiokafka").addHandler(handler)
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, **auth)
    try:
        await asyncio.wait_for(producer.start(), 30)
        return "started"
    except Exception as exc:  # KafkaConnectionError; the reason is in aiokafka's log
        return " ".join([repr(exc), *seen])
    finally:
        await producer.stop()
        logging.getLogger("aiokafka").removeHandler(handler)
