"""The residue scan of ClickHouse (``schemas.residue`` does the matching).

ClickHouse: every table of the database (views are computed from the tables and skipped; a materialized
view's storage is a table of its own and is scanned), every column that can hold content (String,
FixedString, Array, Map, Tuple, JSON and their Nullable/LowCardinality forms; not ALIAS or EPHEMERAL ones,
which store nothing), every physical row. Rows are read without FINAL: an older copy of a row that a
replacement has not yet been merged away is still readable, so it counts. Strings are read as bytes, so
packed token bytes and invalid UTF-8 are seen as stored. Each table is one streamed query.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from clickhouse_connect.driver.client import Client

from schemas.residue import Matcher, Tally

STORE = "clickhouse"
_CONTENT_TYPE = re.compile(r"String|Array|Map|Tuple|JSON|Object|Dynamic|Variant")
_VIEW_ENGINES = ("View", "MaterializedView", "LiveView", "WindowView")
# A row is named by its event id where the table has one, else by its position in the scan.
_ROW_KEYS = ("event_id", "id")


def _quote(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def content_columns(client: Client, database: str, table: str) -> list[str]:
    rows = client.query(
        "SELECT name, type, default_kind FROM system.columns WHERE database = {d:String} AND table = {t:String} "
        "ORDER BY position", parameters={"d": database, "t": table}).result_rows
    return [name for name, type_, kind in rows if _CONTENT_TYPE.search(type_) and kind not in ("ALIAS", "EPHEMERAL")]


def _all_columns(client: Client, database: str, table: str) -> set[str]:
    return {r[0] for r in client.query(
        "SELECT name FROM system.columns WHERE database = {d:String} AND table = {t:String}",
        parameters={"d": database, "t": table}).result_rows}


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def scan_clickhouse(client: Client, matcher: Matcher, tally: Tally, *, database: str | None = None,
                    progress: Callable[[str], None] | None = None) -> None:
    db = database or client.database
    tables = client.query("SELECT name, engine FROM system.tables WHERE database = {d:String} ORDER BY name",
                          parameters={"d": db}).result_rows
    for name, engine in tables:
        if engine in _VIEW_ENGINES:
            tally.count("clickhouse_views_skipped")
            continue
        tally.count("clickhouse_tables")
        rows = _scan_table(client, db, name, matcher, tally)
        if progress:
            progress(f"clickhouse: {db}.{name} {rows} rows")


def _scan_table(client: Client, db: str, table: str, matcher: Matcher, tally: Tally) -> int:
    columns = content_columns(client, db, table)
    if not columns:
        return 0
    key = next((k for k in _ROW_KEYS if k in _all_columns(client, db, table)), None)
    selected = ([key] if key else []) + [c for c in columns if c != key]
    sql = f"SELECT {', '.join(map(_quote, selected))} FROM {_quote(db)}.{_quote(table)}"
    count = 0
    with client.query_row_block_stream(sql, query_formats={"String": "bytes", "FixedString": "bytes"}) as stream:
        for block in stream:
            for row in block:
                count += 1
                label = f"{key}={_text(row[0])}" if key else f"row {count}"
                hits = [h for column, value in zip(selected, row, strict=True)
                        for h in matcher.in_value(value, column)]
                tally.add(STORE, f"{db}.{table} {label}", hits)
    tally.count("clickhouse_rows", count)
    return count
