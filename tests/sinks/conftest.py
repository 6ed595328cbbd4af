"""chDB fixtures: one engine path per test process (a chDB rule), one fresh database per test."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest
from clickhouse_connect.driver.client import Client

from sinks.client import chdb_path_in_use, connect
from sinks.ddl import migrate

_counter = itertools.count()


@pytest.fixture(scope="session")
def chdb_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The process's single chDB directory (reused if something in this process opened one already)."""
    in_use = chdb_path_in_use()
    return f"chdb://{in_use}" if in_use else f"chdb://{tmp_path_factory.mktemp('chdb')}"


def fresh_database(dsn: str, label: str) -> Client:
    name = "t_" + re.sub(r"\W", "_", label)[:40] + f"_{next(_counter)}"
    client = connect(dsn=dsn, database=name, create_database=True)
    migrate(client)
    return client


@pytest.fixture
def ch(chdb_dsn: str, request: pytest.FixtureRequest) -> Iterator[Client]:
    """A migrated, empty database of its own for one test."""
    client = fresh_database(chdb_dsn, request.node.name)
    yield client
    client.command(f"DROP DATABASE IF EXISTS {client.database}")
