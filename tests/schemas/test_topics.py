"""Topic declarations, ``ensure_topics`` and the ``tokentrail topics`` commands on the real broker."""

from __future__ import annotations

import argparse
import dataclasses
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from schemas import topics
from schemas.kafka import config as kafka_config
from schemas.kafka import topic_admin
from tokentrail import topics_cli
from tokentrail.settings import Settings

EXPECTED_NAMES = {
    "tokentrail.calls", "tokentrail.env", "tokentrail.rollouts", "tokentrail.groups", "tokentrail.scores",
    "tokentrail.rewards", "tokentrail.credits", "tokentrail.samples", "tokentrail.trainer-steps",
    "tokentrail.dead-letter", "tokentrail.feedback", "tokentrail.release-decisions", "tokentrail.baselines",
    "tokentrail.subject-keys", "tokentrail.forgotten",
}


def _run(argv: list[str]) -> int:
    """This area's commands through argparse, without importing every CLI module."""
    parser = argparse.ArgumentParser(prog="tokentrail")
    subparsers = parser.add_subparsers()
    topics_cli.register(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args))


def _renamed(prefix: str) -> tuple[topics.TopicSpec, ...]:
    return tuple(dataclasses.replace(spec, name=f"{prefix}.{spec.name}") for spec in topics.ALL_TOPICS)


def _configs(admin: AdminClient, name: str) -> dict[str, str]:
    return topic_admin.describe_topic_configs(admin, [name])[name]


def _wait_for_config(admin: AdminClient, name: str, key: str, value: str, timeout_s: float = 30.0) -> None:
    """Config changes reach the broker's cache shortly after the controller accepts them."""
    deadline = time.monotonic() + timeout_s
    while _configs(admin, name).get(key) != value:
        assert time.monotonic() < deadline, f"{name}: {key} never became {value}"
        time.sleep(0.1)


def test_declarations() -> None:
    assert {spec.name for spec in topics.ALL_TOPICS} == EXPECTED_NAMES
    rollout_scoped = [
        topics.CALLS, topics.ENV, topics.ROLLOUTS, topics.SCORES, topics.REWARDS, topics.CREDITS,
    ]
    assert all(spec.key == "rollout_id" for spec in rollout_scoped)
    assert topics.GROUPS.key == "group_id"
    assert topics.CALLS.retention_ms == topics.ENV.retention_ms == topics.SCORES.retention_ms == -1
    assert topics.DEAD_LETTER.retention_ms >= 365 * topics.DAY_MS
    with pytest.raises(KeyError, match="unknown tokentrail topic"):
        topics.topic("tokentrail.call")


def test_client_configs_keep_security_settings_and_raise_sizes(tokentrail_settings: Settings) -> None:
    kafka = tokentrail_settings.kafka.model_copy(update={
        "security_protocol": "SASL_SSL", "extra_client_config": {"sasl.mechanism": "PLAIN"},
    })
    settings = tokentrail_settings.model_copy(update={"kafka": kafka})
    producer = kafka_config.producer_config(settings.kafka)
    consumer = kafka_config.consumer_config(settings.kafka, "g1")
    for conf in (producer, consumer):
        assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanism"] == "PLAIN"
    assert producer["acks"] == "all" and producer["enable.idempotence"] is True
    assert producer["message.max.bytes"] == kafka.max_message_bytes
    assert consumer["enable.auto.commit"] is False and consumer["group.id"] == "g1"
    assert consumer["max.partition.fetch.bytes"] >= kafka.max_message_bytes
    assert consumer["receive.message.max.bytes"] > consumer["fetch.max.bytes"]


def test_ensure_gateway_topics_creates_the_gateways_own_names(
    kafka_admin: AdminClient, tokentrail_settings: Settings
) -> None:
    """What `conformance` and `harnesses check` run before their own gateway: on a fresh broker it would
    otherwise spool every record for ever ("Unknown topic or partition")."""
    calls, env = (f"test-gw-{uuid.uuid4().hex[:8]}.{name}" for name in ("calls", "env"))
    try:
        report = topic_admin.ensure_gateway_topics(tokentrail_settings.kafka, calls, env)
        assert {calls, env} <= set(report.created) and report.ok
        present = kafka_admin.list_topics(timeout=10).topics
        assert len(present[calls].partitions) == topics.CALLS.partition_count(tokentrail_settings.kafka)
        assert _configs(kafka_admin, env)["cleanup.policy"] == topics.ENV.config(tokentrail_settings.kafka)[
            "cleanup.policy"]
    finally:
        for future in kafka_admin.delete_topics([calls, env]).values():
            future.result()


def test_ensure_creates_all_then_is_idempotent(
    kafka_admin: AdminClient, tokentrail_settings: Settings
) -> None:
    specs = _renamed(f"test-ensure-{uuid.uuid4().hex[:8]}")
    try:
        first = topic_admin.ensure_topics(kafka_admin, tokentrail_settings.kafka, specs)
        assert sorted(first.created) == sorted(spec.name for spec in specs) and first.ok

        second = topic_admin.ensure_topics(kafka_admin, tokentrail_settings.kafka, specs)
        assert second.created == [] and second.ok
        assert sorted(second.existing) == sorted(spec.name for spec in specs)

        present = kafka_admin.list_topics(timeout=10).topics
        for spec in specs:
            assert len(present[spec.name].partitions) == spec.partition_count(tokentrail_settings.kafka)
            configs = _configs(kafka_admin, spec.name)
            for key, value in spec.config(tokentrail_settings.kafka).items():
                assert configs[key] == value, (spec.name, key)
    finally:
        for future in kafka_admin.delete_topics([spec.name for spec in specs]).values():
            future.result()


def test_ensure_reports_and_fixes_differences(
    kafka_admin: AdminClient, tokentrail_settings: Settings
) -> None:
    calls = dataclasses.replace(topics.CALLS, name=f"test-diff-{uuid.uuid4().hex[:8]}.calls")
    try:
        topic_admin.ensure_topics(kafka_admin, tokentrail_settings.kafka, (calls,))
        drift = ConfigResource(ResourceType.TOPIC, calls.name, incremental_configs=[
            ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
        for future in kafka_admin.incremental_alter_configs([drift]).values():
            future.result()
        _wait_for_config(kafka_admin, calls.name, "retention.ms", "3600000")
        wider = dataclasses.replace(calls, partitions=calls.partition_count(tokentrail_settings.kafka) + 2)

        report = topic_admin.ensure_topics(kafka_admin, tokentrail_settings.kafka, (wider,))
        assert {(d.setting, d.actual) for d in report.differences} == {
            ("retention.ms", "3600000"),
            ("partitions", str(calls.partition_count(tokentrail_settings.kafka))),
        }

        fixed = topic_admin.ensure_topics(kafka_admin, tokentrail_settings.kafka, (wider,), fix_configs=True)
        assert [d.setting for d in fixed.altered] == ["retention.ms"]
        assert [d.setting for d in fixed.differences] == ["partitions"]  # never changed automatically
        _wait_for_config(kafka_admin, calls.name, "retention.ms", "-1")
    finally:
        for future in kafka_admin.delete_topics([calls.name]).values():
            future.result()


def test_cli_ensure_and_list(kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["topics", "ensure"]) == 0
    out = capsys.readouterr().out
    assert f"{len(EXPECTED_NAMES)} topics ok" in out
    assert _run(["topics", "list"]) == 0
    listing = capsys.readouterr().out
    for name in EXPECTED_NAMES:
        assert any(line.startswith(name + " ") and "missing" not in line for line in listing.splitlines())
