"""Reading and writing events in ClickHouse: the small API the sink, audit, trace, report and replay share.

Writes take decoded Avro records (``write_records``); reads give rows as dicts (``select_rows``) or
Avro records again (``load_records``, ``load_rollouts``), deduplicated with FINAL. Calls rows read
with their request columns come back with whole request bodies (stored as deltas, rebuilt here);
samples rows read with their token columns come back whole (stored by reference to their calls,
rebuilt and hash-checked here).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client

from schemas.prompt_delta import PromptReconstructionError, reconstruct_prompt
from schemas.tokens import IdArray, unpack_ids
from sinks.ddl import TABLE_NAMES, packed_read_sql, star_columns
from sinks.request_bodies import REQUEST_COLUMNS, RequestBodyDeltas, rebuild_request_bodies
from sinks.rows import (
    RECORD_OF,
    CallTokens,
    Record,
    Row,
    Source,
    column_formats,
    from_row,
    rollout_from_row,
    to_row,
)
from sinks.sample_refs import (
    REBUILD_COLUMNS,
    REF_COLUMNS,
    SampleRefs,
    is_input_ref,
    is_ref,
    rebuild_sample,
    stored_call_digest,
)
from sinks.shared_prompts import WINDOW_US, Key, SharedPrompts, rebuild_shared_prompts

# Keep IN (...) lists and query sizes moderate.
ID_CHUNK = 2000


def insert_rows(client: Client, table: str, rows: Sequence[Row], dedup_token: str | None = None) -> None:
    """Insert rows that all have the same columns; ``dedup_token`` makes a retried insert a no-op."""
    if not rows:
        return
    if table not in TABLE_NAMES:
        raise ValueError(f"unknown table {table!r}")
    columns = list(rows[0])
    data = [[row[c] for c in columns] for row in rows]
    settings: dict[str, Any] = {}
    if dedup_token:
        settings["insert_deduplication_token"] = dedup_token
    client.insert(table, data, column_names=columns, settings=settings)


def group_rows(
    records: Iterable[tuple[str, Record]], source: Source | None = None, samples: SampleRefs | None = None
) -> dict[str, list[Row]]:
    """Rows per table; calls' request bodies become deltas on earlier calls' bodies among ``records``.
    Calls are noted in ``samples`` (a writer that inserts them first may then ``encode_samples``)."""
    by_table: dict[str, list[Row]] = defaultdict(list)
    bodies = RequestBodyDeltas()
    samples = samples or SampleRefs()
    for name, record in records:
        table, row = to_row(name, record, source)
        if table == "calls":
            row = bodies.encode(row)
            samples.note_call(row)
        by_table[table].append(row)
    return by_table


def inserts_in_order(tables: Iterable[str]) -> list[str]:
    """Tables in the order their rows must be inserted: calls before samples that reference them."""
    return sorted(tables, key=lambda t: t != "calls")


def write_records(client: Client, records: Iterable[tuple[str, Record]]) -> dict[str, int]:
    """Insert (schema name, record) pairs, one insert per table (calls first); returns rows per table."""
    refs = SampleRefs()
    grouped = group_rows(records, samples=refs)
    insert_grouped(client, grouped, refs)
    return {table: len(rows) for table, rows in grouped.items()}


def insert_grouped(
    client: Client, rows_by_table: dict[str, list[Row]], refs: SampleRefs, shared: SharedPrompts | None = None
) -> None:
    """One insert per table, as the sink inserts a batch: samples reference the calls ``refs`` noted or
    ClickHouse stores, calls go in before the samples that reference them, and identical full prompts
    are stored once (within this insert, and on prompts ``shared`` saw stored by earlier ones)."""
    encode_samples(client, refs, rows_by_table.get("samples", []))
    shared = shared if shared is not None else SharedPrompts()
    with shared.storing(rows_by_table.get("calls", []), lambda keys: stored_full_prompts(client, keys)):
        for table in inserts_in_order(rows_by_table):
            # Rows of one table can differ in which optional columns they carry only if builders differ;
            # they do not, so a single insert per table is safe.
            insert_rows(client, table, rows_by_table[table])


def select_rows(
    client: Client,
    table: str,
    where: str = "",
    parameters: dict[str, Any] | None = None,
    columns: str = "*",
    order_by: str = "",
    final: bool = True,
    rebuild: bool = True,
) -> list[Row]:
    """Rows of a table as dicts. With ``rebuild`` (the default), columns stored as deltas or references
    come back whole: calls' request bodies and shared prompts, samples' token columns (SampleRefError,
    TextDeltaError or SharedPromptError if one fails)."""
    added: list[str] = []
    if table == "samples" and rebuild:
        columns, added = _with_sample_ref_columns(columns)
    if table == "calls" and rebuild:
        columns, added = _with_shared_prompt_columns(columns)
    if columns == "*":
        columns = star_columns(table)  # calls: token bytes rebuilt from the stored arrays
    sql = f"SELECT {columns} FROM {table}{' FINAL' if final else ''}"
    if where:
        sql += f" WHERE {where}"
    if order_by:
        sql += f" ORDER BY {order_by}"
    result = client.query(sql, parameters=parameters or {}, column_formats=column_formats(table))
    rows = list(result.named_results())
    if rebuild and table == "calls" and rows and "request_base_call_id" in rows[0] and "request_json" in rows[0]:
        rebuild_request_bodies(rows, lambda ids: _stored_request_rows(client, ids))
    if rebuild and table == "calls" and rows and "prompt_shared_call_id" in rows[0]:
        rebuild_shared_prompts(rows, lambda ids: _stored_prompt_rows(client, ids))
    if rebuild and table == "samples" and any(is_ref(r) for r in rows):
        rebuild_samples(rows, CallTokenCache(client))
    for row in rows if added else ():
        for column in added:
            del row[column]
    return rows


_TOKEN_COLUMN = re.compile(r"\b(input_ids|rollout_logprobs)\b")


# What rebuilding a shared prompt needs besides the ids (checked against the row's length and sha256).
SHARED_PROMPT_COLUMNS = ("call_id", "prompt_length", "prompt_sha256", "prompt_shared_call_id")
_PROMPT_IDS = re.compile(r"\bprompt_ids\b")


def _with_shared_prompt_columns(columns: str) -> tuple[str, list[str]]:
    """``columns`` plus what rebuilding a shared prompt needs, when they name the prompt ids."""
    return _with_rebuild_columns(columns, _PROMPT_IDS, SHARED_PROMPT_COLUMNS)


def _with_sample_ref_columns(columns: str) -> tuple[str, list[str]]:
    """``columns`` plus what rebuilding referenced token columns needs, and which of those it added."""
    return _with_rebuild_columns(columns, _TOKEN_COLUMN, (*REF_COLUMNS, *REBUILD_COLUMNS))


def _with_rebuild_columns(columns: str, rebuilt: re.Pattern[str], needed: Sequence[str]) -> tuple[str, list[str]]:
    """``columns`` plus those of ``needed`` it lacks when it names a ``rebuilt`` column; and those added."""
    if columns == "*" or not rebuilt.search(columns):
        return columns, []
    added = [c for c in needed if not re.search(rf"\b{c}\b", columns)]
    return ", ".join([columns, *added]), added


def encode_samples(client: Client | None, refs: SampleRefs, rows: list[Row]) -> None:
    """Let samples rows reference their calls where ``refs`` can prove them equal, in place.

    The caller inserts the calls it noted in ``refs`` before these rows. With a ``client``, calls that
    ``refs`` has not seen but ClickHouse already stores (an earlier batch, another writer, a run before
    a restart) are read back first, their prompts rebuilt and hash-checked; a call missing or broken
    stays unknown, and what needs it is stored whole.
    """
    if client is not None:
        note_stored_calls(client, refs, set().union(*(refs.unknown_calls(r) for r in rows)))
    for row in rows:
        refs.encode(row)


def note_stored_calls(client: Client, refs: SampleRefs, wanted: set[str]) -> None:
    if not wanted:
        return
    cache = CallTokenCache(client)
    cache.fetch(wanted)
    for call_id in sorted(wanted):
        try:
            tokens = cache.tokens(call_id)
        except (PromptReconstructionError, KeyError):
            continue
        if tokens is not None:
            refs.note_stored(call_id, stored_call_digest(cache.rows[call_id]["prompt_sha256"], tokens))


def rebuild_samples(rows: list[Row], cache: CallTokenCache) -> None:
    """Rebuild every referenced token column of ``rows`` in place (SampleRefError names a bad sample)."""
    cache.fetch(
        c
        for row in rows
        if is_ref(row)
        for c in (*(row["input_ref_call_ids"] if is_input_ref(row) else ()), *row["seg_call_id"])
    )
    for row in rows:
        if is_ref(row):
            rebuild_sample(row, cache.call_tokens)


def _stored_request_rows(client: Client, call_ids: Iterable[str]) -> list[Row]:
    """Request columns as stored of the given calls and every other call of their attempts: a body's
    bases are earlier calls of its attempt, so one query brings a whole chain (not rebuilt here)."""
    return _query_by_ids(
        client,
        f"SELECT {', '.join(REQUEST_COLUMNS)} FROM calls FINAL WHERE call_id IN {{ids:Array(String)}} "
        "OR attempt_id IN (SELECT attempt_id FROM calls WHERE call_id IN {ids:Array(String)})",
        call_ids,
    )


def _stored_prompt_rows(client: Client, call_ids: Iterable[str]) -> list[Row]:
    """Prompt ids as stored (bytes) and shared-prompt references of the given calls (not rebuilt here)."""
    return _query_by_ids(
        client,
        f"SELECT call_id, {packed_read_sql('prompt_ids')} AS prompt_ids, prompt_shared_call_id "
        "FROM calls FINAL WHERE call_id IN {ids:Array(String)}",
        call_ids,
    )


def stored_full_prompts(client: Client, keys: list[Key]) -> dict[Key, str]:
    """For each (window, sha256, length, subject) key: the smallest call id storing that full prompt whole,
    its stored ids checked against the sha256 in SQL, so a corrupt row is never named."""
    rows = _query_by_ids(
        client,
        f"SELECT intDiv(received_at_us, {WINDOW_US}) AS time_window, prompt_sha256, prompt_length, "
        "ifNull(subject, '') AS subj, "
        "min(call_id) AS call_id FROM calls WHERE prompt_sha256 IN {ids:Array(String)} "
        "AND prompt_base_call_id IS NULL AND prompt_shared_call_id IS NULL AND NOT prompt_ids_null "
        "AND length(prompt_ids_arr) = prompt_length "
        "AND lower(hex(SHA256(reinterpretAsString(prompt_ids_arr)))) = prompt_sha256 "
        "GROUP BY time_window, prompt_sha256, prompt_length, subj",
        (sha for _, sha, _, _ in keys),
    )
    wanted = set(keys)
    found = (((r["time_window"], r["prompt_sha256"], r["prompt_length"], r["subj"]), r["call_id"]) for r in rows)
    return {key: call_id for key, call_id in found if key in wanted}


def _query_by_ids(client: Client, sql: str, ids: Iterable[str]) -> list[Row]:
    """Rows of calls ``sql`` taking the ids as ``{ids:Array(String)}``, ID_CHUNK ids a query."""
    unique = sorted(set(ids))
    out: list[Row] = []
    for i in range(0, len(unique), ID_CHUNK):
        result = client.query(sql, parameters={"ids": unique[i : i + ID_CHUNK]}, column_formats=column_formats("calls"))
        out += result.named_results()
    return out


def rows_by_ids(
    client: Client, table: str, ids: Iterable[str], id_column: str = "event_id", columns: str = "*"
) -> list[Row]:
    ids = sorted(set(ids))
    out: list[Row] = []
    for i in range(0, len(ids), ID_CHUNK):
        out += select_rows(
            client,
            table,
            f"{id_column} IN {{ids:Array(String)}}",
            {"ids": ids[i : i + ID_CHUNK]},
            columns=columns,
        )
    return out


def load_records(
    client: Client, table: str, where: str = "", parameters: dict[str, Any] | None = None, order_by: str = ""
) -> list[Record]:
    """Avro records of a table (not rollouts: use ``load_rollouts``)."""
    return [from_row(table, row) for row in select_rows(client, table, where, parameters, order_by=order_by)]


def table_counts(client: Client) -> dict[str, int]:
    out = {}
    for table in TABLE_NAMES:
        out[table] = int(client.query(f"SELECT count() FROM {table} FINAL").result_rows[0][0])
    return out


# ---- calls and their prompts ---------------------------------------------------------------------

CALL_TOKEN_COLUMNS = (
    "call_id, attempt_id, prompt_length, prompt_sha256, prompt_base_call_id, prompt_base_prefix_len, "
    "prompt_shared_call_id, "
    + ", ".join(
        f"{packed_read_sql(name)} AS {name}"
        for name in ("prompt_ids", "prompt_new_ids", "output_ids", "output_logprobs")
    )
)


class CallTokenCache:
    """Calls' tokens with prompts rebuilt through their delta chains, fetched on demand in batches."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.rows: dict[str, Row] = {}
        self.prompts: dict[str, IdArray] = {}
        self.errors: dict[str, str] = {}

    def fetch(self, call_ids: Iterable[str]) -> None:
        """Load the given calls and, transitively, every delta base they need."""
        wanted = {c for c in call_ids if c not in self.rows}
        whole_attempts = False
        while wanted:
            rows = self._rows(wanted, whole_attempts)
            for row in rows:
                self.rows[row["call_id"]] = row
            bases = {r["prompt_base_call_id"] for r in rows if r["prompt_base_call_id"]}
            # Remember unknown ids so the loop ends even if a base is missing.
            for missing in wanted - {r["call_id"] for r in rows}:
                self.rows.setdefault(missing, {})
            wanted = {b for b in bases if b not in self.rows}
            # Bases are earlier calls of the same attempt: fetch those attempts whole, so a chain of any
            # length costs one more query, not one per link.
            whole_attempts = True

    def _rows(self, call_ids: set[str], whole_attempts: bool) -> list[Row]:
        if not whole_attempts:
            return rows_by_ids(self.client, "calls", call_ids, "call_id", CALL_TOKEN_COLUMNS)
        ids = sorted(call_ids)
        out: list[Row] = []
        for i in range(0, len(ids), ID_CHUNK):
            out += select_rows(
                self.client,
                "calls",
                "attempt_id IN (SELECT attempt_id FROM calls WHERE call_id IN {ids:Array(String)})",
                {"ids": ids[i : i + ID_CHUNK]},
                columns=CALL_TOKEN_COLUMNS,
            )
        return out

    def has(self, call_id: str) -> bool:
        self.fetch([call_id])
        return bool(self.rows.get(call_id))

    def prompt(self, call_id: str) -> IdArray:
        """The call's full prompt ids; raises PromptReconstructionError (or KeyError when unknown)."""
        if call_id in self.prompts:
            return self.prompts[call_id]
        if call_id in self.errors:
            raise PromptReconstructionError(self.errors[call_id])
        self.fetch([call_id])
        row = self.rows.get(call_id)
        if not row:
            raise KeyError(f"call {call_id} is not in the calls table")
        chain: list[str] = []  # walk down to a full prompt (or a cached one), then rebuild upwards
        current: str | None = call_id
        while current and current not in self.prompts and self.rows.get(current):
            if current in chain:
                raise PromptReconstructionError(f"delta chain of call {call_id} loops at {current}")
            chain.append(current)
            current = (self.rows.get(current) or {}).get("prompt_base_call_id")
        for cid in reversed(chain):
            try:
                self.prompts[cid] = reconstruct_prompt(self._prompt_record(cid), self._base_sequence)
            except PromptReconstructionError as exc:
                self.errors[cid] = str(exc)
                raise
        return self.prompts[call_id]

    def _prompt_record(self, call_id: str) -> Record:
        row = self.rows.get(call_id) or {}
        if not row:
            raise PromptReconstructionError(f"call {call_id} is not in the calls table")
        return {
            "length": row["prompt_length"],
            "sha256": row["prompt_sha256"],
            "ids": row["prompt_ids"],
            "base_call_id": row["prompt_base_call_id"],
            "base_prefix_len": row["prompt_base_prefix_len"],
            "new_ids": row["prompt_new_ids"],
        }

    def _base_sequence(self, call_id: str) -> IdArray | None:
        row = self.rows.get(call_id)
        if not row:
            return None
        prompt = self.prompts.get(call_id)
        if prompt is None:
            try:
                prompt = self.prompt(call_id)
            except PromptReconstructionError:
                return None
        return np.concatenate([prompt, unpack_ids(row["output_ids"])])

    def output_ids(self, call_id: str) -> IdArray:
        self.fetch([call_id])
        row = self.rows.get(call_id)
        if not row:
            raise KeyError(f"call {call_id} is not in the calls table")
        return unpack_ids(row["output_ids"])

    def tokens(self, call_id: str) -> CallTokens | None:
        if not self.has(call_id):
            return None
        row = self.rows[call_id]
        return CallTokens(self.prompt(call_id), row["output_ids"], row["output_logprobs"])

    def call_tokens(self, call_id: str) -> CallTokens:
        """Like ``tokens``, but a missing call is a KeyError (and a broken prompt its own error)."""
        tokens = self.tokens(call_id)
        if tokens is None:
            raise KeyError(f"call {call_id} is not in the calls table")
        return tokens


def load_rollouts(
    client: Client,
    where: str = "",
    parameters: dict[str, Any] | None = None,
    cache: CallTokenCache | None = None,
) -> list[Record]:
    """CompletedRollout records rebuilt from the rollouts and calls tables (hashes checked)."""
    rows = select_rows(client, "rollouts", where, parameters, order_by="rollout_id, attempt_id")
    cache = cache or CallTokenCache(client)
    cache.fetch(c for row in rows for c in row["c_call_id"])
    return [rollout_from_row(row, cache.tokens) for row in rows]


__all__ = [
    "RECORD_OF",
    "CallTokenCache",
    "encode_samples",
    "group_rows",
    "insert_grouped",
    "insert_rows",
    "load_records",
    "load_rollouts",
    "rebuild_samples",
    "rows_by_ids",
    "select_rows",
    "table_counts",
    "write_records",
]
