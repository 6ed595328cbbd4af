"""Sink benchmark: Avro messages -> rows -> chDB inserts, and stored bytes of delta-encoded prompts.

Throughput: pre-encoded messages of multi-turn rollouts (every event type) are decoded, mapped to
rows and inserted in batches, as the sink does after polling Kafka (the broker is not measured).
``tokens_per_s`` counts the token ids the calls stand for (prompt + sampled); ``rows_per_s`` counts rows
of every table.

Storage: the same calls stored twice, as recorded (later prompts delta-encoded on the previous call)
and with every prompt in full, in the same table design (``CREATE TABLE calls_full AS calls``, written
through the same EPHEMERAL byte inputs); compressed bytes on disk from system.parts after merging, all
parts wide as in production (the default makes parts under 10 MB compact). ``stored_vs_full_prompts``
is their ratio on disk; ``stored_vs_full_prompts_uncompressed`` is what Kafka, the network and memory see.

Full prompts compress very differently per layout: ZSTD over packed bytes (the released 0001 layout)
finds a prompt's repeat of the previous one inside its 1 MB block, while T64's bit-transposed blocks
hide it. So the stored calls are also compared with full prompts in the 0001 byte layout,
``stored_vs_full_prompts_bytes_layout``: the cheapest way to store full prompts we know, hence the
hardest baseline (with random synthetic ids the stored deltas are already at their entropy).

    python -m bench.sink [--groups N] [--turns T]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import numpy as np

from bench.common import emit
from schemas.codec import get_codec
from schemas.prompt_delta import full_prompt
from sinks.client import connect
from sinks.ddl import CALL_STORED_TOKEN_COLUMNS, TABLES, migrate
from sinks.rows import to_row
from sinks.store import insert_rows
from sinks.synthetic import GroupSpec, synthetic_group

BATCH_ROWS = 2000


def encoded_events(groups: int, turns: int, prompt: int, turn: int, output: int) -> list[tuple[str, bytes]]:
    codec = get_codec()
    out = []
    for i in range(groups):
        spec = GroupSpec(
            group_index=i,
            rollouts=8,
            turns=turns,
            prompt_tokens=prompt,
            turn_tokens=turn,
            output_tokens=output,
            policy_version=1 + i // 4,
        )
        out += [(name, codec.encode(name, rec)) for name, rec in synthetic_group(spec).events]
    return out


def ingest(client: object, messages: list[tuple[str, bytes]]) -> tuple[int, int, float]:
    """Decode, map and insert like the sink; returns (rows, call tokens, seconds)."""
    codec = get_codec()
    start = time.perf_counter()
    pending: dict[str, list[dict]] = {}
    rows = tokens = 0
    for _name, data in messages:
        name, record = codec.decode(data)
        table, row = to_row(name, record)
        if name == "CallRecord":
            tokens += record["prompt"]["length"] + len(record["output_ids"]) // 4
        pending.setdefault(table, []).append(row)
        rows += 1
        if len(pending[table]) >= BATCH_ROWS:
            insert_rows(client, table, pending.pop(table))  # type: ignore[arg-type]
    for table, batch in pending.items():
        insert_rows(client, table, batch)  # type: ignore[arg-type]
    return rows, tokens, time.perf_counter() - start


FULL_TABLES = ("calls_full", "calls_full_bytes")


def full_prompt_calls(client: object) -> None:
    """Copy the calls table with every prompt stored in full (the naive layout), in the current design
    and in the released 0001 design (token ids as packed bytes, String + ZSTD)."""
    from sinks.store import CallTokenCache, select_rows

    client.command("CREATE TABLE calls_full AS calls")  # type: ignore[attr-defined]
    (v1,) = [t for t in TABLES if t.name == "calls"]
    client.command(dataclasses.replace(v1, name="calls_full_bytes").create_sql(client.database))  # type: ignore
    client.command("ALTER TABLE calls_full_bytes MODIFY SETTING min_bytes_for_wide_part = 0")  # type: ignore
    cache = CallTokenCache(client)  # type: ignore[arg-type]
    rows = select_rows(client, "calls", columns="*")  # type: ignore[arg-type]
    cache.fetch(r["call_id"] for r in rows)
    batch = []
    for row in rows:
        full = full_prompt(cache.prompt(row["call_id"]))
        row = {
            k: v
            for k, v in row.items()
            if k not in ("event_time", "ingested_at", "output_tokens", "prompt_stored_tokens")
        }
        row.update(prompt_ids=full["ids"], prompt_base_call_id=None, prompt_base_prefix_len=0, prompt_new_ids=None)
        batch.append(row)
        if len(batch) >= BATCH_ROWS:
            _insert_full(client, batch)
            batch = []
    _insert_full(client, batch)


def _insert_full(client: object, rows: list[dict]) -> None:
    if rows:
        columns = list(rows[0])
        for table in FULL_TABLES:
            client.insert(table, [[r[c] for c in columns] for r in rows], column_names=columns)  # type: ignore


def table_bytes(client: object, table: str) -> tuple[int, int]:
    """(compressed bytes on disk, uncompressed bytes) of a table's active parts."""
    return client.query(  # type: ignore[attr-defined]
        "SELECT sum(bytes_on_disk), sum(data_uncompressed_bytes) FROM system.parts "
        "WHERE database = currentDatabase() AND table = {t:String} AND active",
        parameters={"t": table},
    ).result_rows[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=2, help="groups of 8 rollouts")
    parser.add_argument("--turns", type=int, default=12, help="calls per rollout")
    parser.add_argument("--prompt", type=int, default=4000, help="first prompt tokens")
    parser.add_argument("--turn", type=int, default=1000, help="tool-result tokens added per turn")
    parser.add_argument("--output", type=int, default=300, help="sampled tokens per call")
    args = parser.parse_args()

    messages = encoded_events(args.groups, args.turns, args.prompt, args.turn, args.output)
    with tempfile.TemporaryDirectory(prefix="bench-sink-") as tmp:
        client = connect(dsn=f"chdb://{tmp}", database="bench", create_database=True)
        migrate(client)
        # Wide parts keep per-column sizes in system.columns (small parts are otherwise compact).
        client.command("ALTER TABLE calls MODIFY SETTING min_bytes_for_wide_part = 0")
        rows, tokens, seconds = ingest(client, messages)
        full_prompt_calls(client)
        for table in ("calls", *FULL_TABLES):
            client.command(f"OPTIMIZE TABLE {table} FINAL")
        delta_disk, delta_raw = table_bytes(client, "calls")
        full_disk, full_raw = table_bytes(client, "calls_full")
        bytes_disk, _ = table_bytes(client, "calls_full_bytes")
        part_types = sorted(
            f"{t}:{k}"
            for t, k in client.query(
                "SELECT DISTINCT table, part_type FROM system.parts WHERE database = currentDatabase() "
                "AND active AND table LIKE 'calls%'"
            ).result_rows
        )
        n_calls, logical = client.query("SELECT count(), sum(prompt_length + output_tokens) FROM calls").result_rows[0]
        all_disk = client.query(
            "SELECT sum(bytes_on_disk) FROM system.parts WHERE database = currentDatabase() "
            "AND active AND table NOT IN ('calls_full', 'calls_full_bytes')"
        ).result_rows[0][0]
        sample_tokens = client.query("SELECT sum(tokens) FROM samples").result_rows[0][0]
        token_columns = dict(
            client.query(
                "SELECT table, sum(data_compressed_bytes) FROM system.columns "
                "WHERE database = currentDatabase() "
                "AND (name IN ('prompt_ids', 'prompt_new_ids', 'output_ids', 'output_logprobs') "
                "OR name IN {stored:Array(String)}) GROUP BY table",
                parameters={"stored": list(CALL_STORED_TOKEN_COLUMNS)},
            ).result_rows
        )
    emit(
        {
            "messages": len(messages),
            "rows": rows,
            "calls": int(n_calls),
            "call_tokens": int(tokens),
            "seconds": round(seconds, 3),
            "rows_per_s": round(rows / seconds, 1),
            "tokens_per_s": round(tokens / seconds, 1),
            "calls_bytes_delta": int(delta_disk),
            "calls_bytes_full_prompts": int(full_disk),
            "calls_uncompressed_delta": int(delta_raw),
            "calls_uncompressed_full_prompts": int(full_raw),
            "token_column_bytes_delta": int(token_columns.get("calls", 0)),
            "token_column_bytes_full_prompts": int(token_columns.get("calls_full", 0)),
            "token_column_bytes_full_prompts_bytes_layout": int(token_columns.get("calls_full_bytes", 0)),
            "calls_bytes_full_prompts_bytes_layout": int(bytes_disk),
            "part_types": part_types,
            "calls_bytes_per_token": round(delta_disk / logical, 4),
            "all_tables_bytes_per_call_token": round(all_disk / logical, 4),
            "sample_tokens": int(sample_tokens),
            "stored_vs_full_prompts_uncompressed": round(delta_raw / full_raw, 4),
            "stored_vs_full_prompts_bytes_layout": round(delta_disk / bytes_disk, 4),
            "stored_vs_full_prompts": round(delta_disk / full_disk, 4),
        }
    )


if __name__ == "__main__":
    np.seterr(all="raise")
    main()
