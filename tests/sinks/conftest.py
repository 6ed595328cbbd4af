"""chDB fixtures: one engine path per test process (a chDB rule), one fresh database per test.

Migrating a database runs ~150 DDL statements (about 100 of them ALTERs, each a metadata rewrite): 3-10 s
of wall time a database on the 2-core machine, paid by ~90 tests. So the session migrates one template
database, and each test's database is a copy of it: every table created from the template's own
``create_table_query``, its ``schema_migrations`` rows, and the views created as ``migrate`` creates them
(~1 s). ``test_store.py::test_migrate_is_idempotent_and_creates_everything`` migrates a database for real
and checks that a copy equals it, table by table and view by view.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest
from clickhouse_connect.driver.client import Client

from sinks.client import chdb_path_in_use, connect
from sinks.ddl import migrate
from sinks.ddl.runner import MIGRATIONS_TABLE
from sinks.ddl.views import VIEWS, view_sql

_counter = itertools.count()
TEMPLATE_DB = "t_migrated_template"


@pytest.fixture(scope="session")
def chdb_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The process's single chDB directory (reused if something in this process opened one already)."""
    in_use = chdb_path_in_use()
    return f"chdb://{in_use}" if in_use else f"chdb://{tmp_path_factory.mktemp('chdb')}"


@pytest.fixture(scope="session")
def migrated_template(chdb_dsn: str) -> str:
    """A database migrated once per session, the template every test's database copies."""
    client = connect(dsn=chdb_dsn, database=TEMPLATE_DB, create_database=True)
    migrate(client)
    return TEMPLATE_DB


def copy_database(client: Client, source: str, target: str) -> None:
    """Create ``target`` with the tables of the migrated ``source`` (same DDL), its migration records and
    the views, as ``migrate`` would have left it; ``client`` may be on any database."""
    client.command(f"CREATE DATABASE {target}")
    tables = client.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = {db:String} "
        "AND engine NOT LIKE '%View' ORDER BY name", parameters={"db": source}).result_rows
    prefix = f"CREATE TABLE {source}."
    for name, ddl in tables:
        if not ddl.startswith(prefix) or f"{source}." in ddl[len(prefix):]:  # a reference we would not move
            raise AssertionError(f"cannot copy {source}.{name}: {ddl[:200]}")
        client.command(f"CREATE TABLE {target}." + ddl[len(prefix):])
    client.command(f"INSERT INTO {target}.{MIGRATIONS_TABLE} SELECT * FROM {source}.{MIGRATIONS_TABLE}")
    for name in VIEWS:
        client.command(view_sql(target, name))


def database_name(label: str) -> str:
    return "t_" + re.sub(r"\W", "_", label)[:40] + f"_{next(_counter)}"


def fresh_database(dsn: str, label: str, template: str) -> Client:
    """A migrated, empty database (a copy of ``template``) named after ``label``."""
    name = database_name(label)
    client = connect(dsn=dsn, database=template)
    copy_database(client, template, name)
    client.database = name
    return client


@pytest.fixture
def ch(chdb_dsn: str, migrated_template: str, request: pytest.FixtureRequest) -> Iterator[Client]:
    """A migrated, empty database of its own for one test."""
    client = fresh_database(chdb_dsn, request.node.name, migrated_template)
    yield client
    client.command(f"DROP DATABASE IF EXISTS {client.database}")
