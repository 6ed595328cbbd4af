"""One ClickHouse client factory for the embedded engine (chDB) and a ClickHouse server.

``chdb:///abs/dir`` (the default) runs ClickHouse inside this process through clickhouse-connect's
chDB driver; ``http(s)://host:8123`` talks to a server. Both give the same client API, and every
DDL statement and query in ``sinks/`` runs unchanged on either.

chDB facts that shape this module: one engine path per process (a second path is refused), and one
process per directory (a second process cannot lock the directory). So the path of the first chDB
client is remembered and a different one is refused here with an explanation.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from sinks.settings import ClickHouseSettings

_DB_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_lock = threading.Lock()
_chdb_path: str | None = None


class ClickHouseConfigError(ValueError):
    """A DSN or database name that cannot work; the message says what to change."""


@dataclass(frozen=True)
class Target:
    """A parsed DSN."""

    kind: str  # "chdb" or "http"
    chdb_path: str = ""  # absolute directory, or ":memory:"
    host: str = ""
    port: int = 8123
    secure: bool = False
    username: str = ""
    password: str = ""

    @property
    def embedded(self) -> bool:
        return self.kind == "chdb"


def parse_dsn(dsn: str, username: str = "default", password: str = "") -> Target:
    url = urlparse(dsn)
    if url.scheme == "chdb":
        raw = (url.netloc + url.path) if url.netloc else url.path
        if raw in ("memory", ":memory:"):
            return Target("chdb", chdb_path=":memory:")
        if not raw.startswith("/"):
            raise ClickHouseConfigError(f"chDB DSN needs an absolute directory, e.g. chdb:///srv/ch; got {dsn!r}")
        return Target("chdb", chdb_path=str(Path(raw)))
    if url.scheme in ("http", "https"):
        if not url.hostname:
            raise ClickHouseConfigError(f"ClickHouse URL has no host: {dsn!r}")
        secure = url.scheme == "https"
        return Target(
            "http",
            host=url.hostname,
            port=url.port or (8443 if secure else 8123),
            secure=secure,
            username=unquote(url.username) if url.username else username,
            password=unquote(url.password) if url.password else password,
        )
    raise ClickHouseConfigError(
        f"unsupported ClickHouse DSN {dsn!r}: use chdb:///abs/dir (embedded) or http(s)://host:8123"
    )


def check_database_name(name: str) -> str:
    if not _DB_NAME.match(name):
        raise ClickHouseConfigError(f"database name {name!r} must match {_DB_NAME.pattern}")
    return name


def _claim_chdb_path(path: str) -> None:
    global _chdb_path
    with _lock:
        if _chdb_path is None:
            _chdb_path = path
        elif _chdb_path != path:
            raise ClickHouseConfigError(
                f"this process already runs chDB on {_chdb_path}; chDB allows one path per process, so "
                f"{path} cannot be opened here (use the same DSN, or a separate process)"
            )


def chdb_path_in_use() -> str | None:
    """The chDB directory this process has opened, if any."""
    return _chdb_path


def connect(
    settings: ClickHouseSettings | None = None,
    *,
    dsn: str | None = None,
    database: str | None = None,
    create_database: bool = False,
) -> Client:
    """A client on ``database`` (default: the section's database; no section: its defaults).

    With ``create_database`` the database is created when missing (migrations do this); otherwise a
    missing database is an error from ClickHouse itself.
    """
    cfg = settings or ClickHouseSettings()
    target = parse_dsn(dsn or cfg.dsn, cfg.username, cfg.password)
    db = check_database_name(database or cfg.database)
    if target.embedded:
        if target.chdb_path != ":memory:":
            Path(target.chdb_path).mkdir(parents=True, exist_ok=True)
        _claim_chdb_path(target.chdb_path)
        client_dsn = "chdb://memory" if target.chdb_path == ":memory:" else f"chdb://{target.chdb_path}"
        try:
            client = clickhouse_connect.get_client(dsn=client_dsn)
        except clickhouse_connect.driver.exceptions.ProgrammingError as exc:
            if "lock" in str(exc).lower():
                raise ClickHouseConfigError(
                    f"chDB directory {target.chdb_path} is in use by another process (one process per "
                    "directory); stop it (e.g. the running sink) or point a ClickHouse server URL at "
                    "the data"
                ) from exc
            raise
    else:
        client = clickhouse_connect.get_client(
            host=target.host,
            port=target.port,
            secure=target.secure,
            username=target.username,
            password=target.password,
        )
    if create_database:
        client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
    elif not database_exists(client, db):
        raise ClickHouseConfigError(f"database {db!r} does not exist; run `tokentrail clickhouse migrate`")
    client.database = db
    return client


def database_exists(client: Client, name: str) -> bool:
    rows = client.query(
        "SELECT count() FROM system.databases WHERE name = {n:String}", parameters={"n": name}
    ).result_rows
    return bool(rows[0][0])


def is_embedded(client: Client) -> bool:
    return type(client).__name__.lower().startswith("chdb")
