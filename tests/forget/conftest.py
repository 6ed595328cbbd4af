"""Forgetting fixtures: a key topic and a Forgotten topic of this test's own (deleted afterwards), and the
forget settings that name them, sealing on."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from schemas.kafka.key_store import ForgetSettings


@pytest.fixture
def forget_settings(kafka_bootstrap: str, kafka_admin: AdminClient) -> Iterator[ForgetSettings]:
    tag = uuid.uuid4().hex[:8]
    settings = ForgetSettings(enabled=True, keys_topic=f"test.keys.{tag}", forgotten_topic=f"test.forgotten.{tag}",
                              refresh_s=0.2)
    yield settings
    futures = kafka_admin.delete_topics([settings.keys_topic, settings.forgotten_topic], operation_timeout=30)
    for future in futures.values():
        try:
            future.result(timeout=60)
        except Exception:  # a topic the test never created
            pass
