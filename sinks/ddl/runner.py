"""Applying the migrations: once each, recorded in ``schema_migrations``, then the views; or the whole DDL as
one script for a server, and its read-only dashboard user."""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from sinks.ddl.migrations import MIGRATIONS
from sinks.ddl.views import VIEWS, view_sql

MIGRATIONS_TABLE = "schema_migrations"


def applied_migrations(client: Client, db: str) -> set[str]:
    return {row[0] for row in client.query(f"SELECT id FROM {db}.{MIGRATIONS_TABLE}").result_rows}


def migrate(client: Client, db: str | None = None) -> list[str]:
    """Create the database, tables and views; returns the ids of migrations applied now.

    Safe to run any number of times: applied migrations are recorded and every statement is itself
    idempotent (IF NOT EXISTS / OR REPLACE), so a run interrupted half-way can simply be repeated.
    """
    db = db or client.database
    client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {db}.{MIGRATIONS_TABLE} (id String, description String, "
        "applied_at DateTime64(6) DEFAULT now64(6)) ENGINE = ReplacingMergeTree ORDER BY id"
    )
    done = applied_migrations(client, db)
    applied = []
    for migration in MIGRATIONS:
        if migration.id in done:
            continue
        for statement in migration.statements(db):
            client.command(statement)
        client.insert(
            f"{db}.{MIGRATIONS_TABLE}",
            [[migration.id, migration.description]],
            column_names=["id", "description"],
        )
        applied.append(migration.id)
    for name in VIEWS:
        client.command(view_sql(db, name))
    return applied


def schema_sql(db: str) -> str:
    """The full DDL as one SQL script (for a server: `tokentrail clickhouse ddl | clickhouse-client -n`)."""
    parts = [f"CREATE DATABASE IF NOT EXISTS {db};"]
    parts += [statement + ";" for m in MIGRATIONS for statement in m.statements(db)]
    parts += [view_sql(db, name) + ";" for name in VIEWS]
    return "\n\n".join(parts) + "\n"


def readonly_user_sql(db: str, user: str, password_sha256_hex: str) -> list[str]:
    """A read-only user for dashboards (server mode only: chDB has no users or grants)."""
    return [
        f"CREATE USER IF NOT EXISTS {user} IDENTIFIED WITH sha256_hash BY '{password_sha256_hex}' "
        "SETTINGS readonly = 1",
        f"GRANT SELECT ON {db}.* TO {user}",
    ]
