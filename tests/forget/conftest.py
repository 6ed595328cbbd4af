"""Forgetting fixtures: a key topic and a Forgotten topic of this test's own (deleted afterwards), and the
forget settings that name them, sealing on."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from schemas.codec import install_sealer
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore
from schemas.sealing import Sealer
from tokentrail.settings import Settings


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


@pytest.fixture
def sealing(tokentrail_settings: Settings, forget_settings: ForgetSettings) -> Iterator[KafkaKeyStore]:
    """This process seals and opens as every component would (gateway, stages, sink and trainer share it)."""
    store = KafkaKeyStore(tokentrail_settings.kafka, forget_settings)
    previous = install_sealer(Sealer(store))
    yield store
    install_sealer(previous)
    store.close()
