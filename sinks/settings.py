"""The ``clickhouse`` settings section (``TOKENTRAIL_CLICKHOUSE__*``), read by ``sinks.client``."""

from __future__ import annotations

from pydantic import BaseModel

from schemas.local_paths import VAR_DIR


class ClickHouseSettings(BaseModel):
    # chdb:///abs/path (embedded, default) or http(s)://host:8123 (server).
    dsn: str = f"chdb://{VAR_DIR / 'clickhouse'}"
    database: str = "tokentrail"
    username: str = "default"
    password: str = ""
    readonly_user: str = "tokentrail_dashboards"
