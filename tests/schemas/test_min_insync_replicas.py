"""Topics carry ``min.insync.replicas`` from ``kafka.min_insync_replicas`` so that the producers' acks=all
means that many replicas on a cluster (issue 17); 1, the default, suits the single local broker."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from confluent_kafka.admin import AdminClient
from pydantic import ValidationError

from schemas import topics
from schemas.kafka import topic_admin
from schemas.kafka.config import KafkaSettings
from tokentrail.settings import Settings


def test_the_setting_and_the_topic_config() -> None:
    assert KafkaSettings().min_insync_replicas == 1
    for spec in topics.ALL_TOPICS:
        assert spec.config(KafkaSettings())["min.insync.replicas"] == "1"
        assert spec.config(KafkaSettings(min_insync_replicas=2))["min.insync.replicas"] == "2"
    with pytest.raises(ValidationError):
        KafkaSettings(min_insync_replicas=0)


def test_the_setting_reads_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENTRAIL_KAFKA__MIN_INSYNC_REPLICAS", "2")
    assert Settings().kafka.min_insync_replicas == 2


def test_topics_are_created_with_it_and_a_cluster_too_small_for_it_is_reported(
        kafka_admin: AdminClient, tokentrail_settings: Settings) -> None:
    """On the local broker (one replica): created with min.insync.replicas 1 and ok; asked for 2, the
    differences name the replication that cannot satisfy it, and fix_configs leaves the topic as it was
    (2 would refuse every acks=all write); a good ensure right after is ok again."""
    calls = dataclasses.replace(topics.CALLS, name=f"test-isr-{uuid.uuid4().hex[:8]}.calls")
    kafka = tokentrail_settings.kafka
    try:
        created = topic_admin.ensure_topics(kafka_admin, kafka, (calls,))
        assert created.created == [calls.name] and created.ok
        configs = topic_admin.describe_topic_configs(kafka_admin, [calls.name])[calls.name]
        assert configs["min.insync.replicas"] == str(kafka.min_insync_replicas) == "1"

        wanting = kafka.model_copy(update={"min_insync_replicas": 2})
        report = topic_admin.ensure_topics(kafka_admin, wanting, (calls,), fix_configs=True)
        assert not report.ok
        assert sorted(d.setting for d in report.differences) == ["min.insync.replicas", "replication factor"]
        assert report.altered == []
        (replication,) = [d for d in report.differences if d.setting == "replication factor"]
        assert replication.actual == "1" and "min.insync.replicas" in replication.describe()

        again = topic_admin.ensure_topics(kafka_admin, kafka, (calls,), fix_configs=True)
        assert again.ok, [d.describe() for d in again.differences]
        configs = topic_admin.describe_topic_configs(kafka_admin, [calls.name])[calls.name]
        assert configs["min.insync.replicas"] == "1"
    finally:
        for future in kafka_admin.delete_topics([calls.name]).values():
            future.result()
