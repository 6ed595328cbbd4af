"""Fixtures shared by every test area. Area-specific fixtures belong in tests/<area>/conftest.py.

Kafka: ``kafka_bootstrap`` reuses a broker already answering on settings.kafka.bootstrap_servers or
starts the local one (and stops it at the end only if this run started it); any test that uses it is
marked ``kafka`` automatically. ``new_topic`` makes throwaway topics with unique names. Under pytest-xdist
(``make test-quick`` runs two workers) each worker runs the session fixtures: the broker start is
serialised by a lock file, and the controller stops a broker that a worker started once every worker is done.

Reference model (tests/models, tests/producers): ``model_dir``, built once (cached in settings.model.dir)
per session, and ``renderer``, a ChatRenderer on it.
"""

from __future__ import annotations

import fcntl
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from models.reference.build import build_model
from producers.rendering import ChatRenderer
from schemas.kafka.config import admin_config
from schemas.kafka.topic_admin import ensure_topics
from tokentrail import kafka_local
from tokentrail.settings import KafkaSettings, Settings, get_settings

# ---------------------------------------------------------------- reference model


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return build_model(get_settings().model.dir)


@pytest.fixture(scope="session")
def renderer(model_dir: Path) -> ChatRenderer:
    return ChatRenderer(model_dir)


# ---------------------------------------------------------------- sealing

@pytest.fixture(autouse=True)
def _process_sealer_restored() -> Iterator[None]:
    """A command run in-process installs the sealer of its settings for the whole process (sealing is on by
    default, tokentrail/cli.py): put back what was there before the test, so no test seals under another's
    key store, and close the key store the test left behind."""
    from schemas.codec import install_sealer, process_sealer

    before = process_sealer()
    yield
    left = process_sealer()
    if left is not before:
        install_sealer(before)
        close = getattr(left.keyring, "close", None) if left is not None else None
        if close is not None:
            close()


# ---------------------------------------------------------------- Kafka


# Tiers by cost (README "Tests"): ``e2e`` is set by the end-to-end modules themselves (``pytestmark``)
# and implied by ``slow``; ``integration`` by the real services a test's fixtures reach; ``unit`` is the
# rest. Every test gets exactly one, so ``-m "not e2e"`` (make test-quick) and ``-m unit`` select by cost.
INTEGRATION_FIXTURES = frozenset({"kafka_bootstrap", "chdb_dsn"})
# Fixtures that start long-running processes: faust worker processes, a private broker that the test stops
# and restarts (tens of seconds a test).
E2E_FIXTURES = frozenset({"make_stream_rig", "private_broker"})


def tier(item: pytest.Item) -> str:
    fixtures = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("e2e") or item.get_closest_marker("slow") or E2E_FIXTURES & fixtures:
        return "e2e"
    if INTEGRATION_FIXTURES & fixtures:
        return "integration"
    return "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)
        name = tier(item)
        if not item.get_closest_marker(name):
            item.add_marker(getattr(pytest.mark, name))


@pytest.fixture(scope="session")
def tokentrail_settings() -> Settings:
    """The settings of this run (defaults plus TOKENTRAIL_* environment overrides)."""
    return get_settings()


# The xdist worker that started the broker says so in its ``workeroutput``; the controller stops it.
STARTED_KAFKA = "tokentrail_started_kafka"
_WORKER_STARTED_KAFKA = pytest.StashKey[bool]()


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@contextmanager
def broker_start_lock(kafka: KafkaSettings) -> Iterator[None]:
    """Held while a process checks the broker, starts it if none answers and brings the topics to spec: two
    xdist workers on a fresh machine would otherwise both start a node on one data dir, or both create topics."""
    lock_path = Path(kafka.data_dir).parent / f".{Path(kafka.data_dir).name}-start.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def kafka_bootstrap(tokentrail_settings: Settings, pytestconfig: pytest.Config) -> Iterator[str]:
    """Bootstrap servers of a running broker on which every tokentrail topic exists."""
    settings = tokentrail_settings
    kafka = settings.kafka
    worker = is_xdist_worker(pytestconfig)
    with broker_start_lock(kafka):
        started_here = not kafka_local.broker_answers(kafka)
        if started_here:
            kafka_local.start(wait_s=120, kafka=kafka)
            if worker:  # stopped by the controller after the last worker (pytest_sessionfinish below)
                pytestconfig.workeroutput[STARTED_KAFKA] = True  # type: ignore[attr-defined]
        # A broker kept from an earlier run may carry older topic configs: bring them to the spec.
        report = ensure_topics(AdminClient(admin_config(settings.kafka)), settings.kafka, fix_configs=True)
    if not report.ok:
        pytest.fail("topics differ from schemas/topics.py: "
                    + "; ".join(d.describe() for d in report.differences))
    try:
        yield kafka.bootstrap_servers
    finally:
        if started_here and not worker:
            kafka_local.stop(kafka=kafka)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist, on the controller: remember that a finished worker started the broker."""
    if getattr(node, "workeroutput", {}).get(STARTED_KAFKA):
        node.config.stash[_WORKER_STARTED_KAFKA] = True  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not is_xdist_worker(session.config) and session.config.stash.get(_WORKER_STARTED_KAFKA, False):
        kafka_local.stop(kafka=get_settings().kafka)


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str, tokentrail_settings: Settings) -> AdminClient:
    return AdminClient(admin_config(tokentrail_settings.kafka))


NewTopicFactory = Callable[..., str]


@pytest.fixture
def new_topic(kafka_admin: AdminClient, request: pytest.FixtureRequest) -> Iterator[NewTopicFactory]:
    """``new_topic(partitions=3, config=None) -> name``: a topic unique to this test, deleted afterwards."""
    created: list[str] = []
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:80]

    def make(partitions: int = 3, config: dict[str, str] | None = None) -> str:
        name = f"test.{stem}.{uuid.uuid4().hex[:8]}"
        topic = NewTopic(name, partitions, replication_factor=-1, config=config or {})
        for future in kafka_admin.create_topics([topic], operation_timeout=30).values():
            future.result(timeout=60)
        created.append(name)
        return name

    yield make
    if created:
        for future in kafka_admin.delete_topics(created, operation_timeout=30).values():
            future.result(timeout=60)
