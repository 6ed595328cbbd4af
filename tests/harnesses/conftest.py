"""Fixtures of the harness tests: the harness model variant (spec ``harness``), built once and cached in
settings ``model.harness_dir``; one ``tokentrail harnesses check`` run shared by the through-gateway tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from models.reference.build import build_model
from models.reference.spec import HARNESS_SPEC
from tests.harnesses.check_run import CheckRun, run_check
from tokentrail.settings import get_settings


@pytest.fixture(scope="session")
def harness_model_dir() -> Path:
    return build_model(get_settings().model.harness_dir, spec=HARNESS_SPEC)


@pytest.fixture(scope="session")
def harnesses_check(kafka_admin: AdminClient, harness_model_dir: Path) -> Iterator[CheckRun]:
    """``tokentrail harnesses check`` over every harness, once per session, on two topics of its own (deleted
    afterwards): its gateway on the harness model variant, each harness's scripted task."""
    stem = f"test.harnesses-check.{uuid.uuid4().hex[:8]}"
    topics = {"calls_topic": f"{stem}.calls", "env_topic": f"{stem}.env"}
    created = [NewTopic(name, 1, replication_factor=-1) for name in topics.values()]
    for future in kafka_admin.create_topics(created, operation_timeout=30).values():
        future.result(timeout=60)
    try:
        yield run_check(get_settings(), topics)
    finally:
        for future in kafka_admin.delete_topics(list(topics.values()), operation_timeout=30).values():
            future.result(timeout=60)
