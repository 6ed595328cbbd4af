"""Sink benchmark: Avro messages -> rows -> chDB inserts, and stored bytes of delta-encoded prompts.

Throughput: pre-encoded messages of multi-turn rollouts (every event type) are decoded, mapped to
rows and inserted in batches, as the sink does after polling Kafka (the broker is not measured).
``tokens_per_s`` counts the token ids the calls stand for (prompt + sampled); ``rows_per_s`` counts rows
of every table.

Storage: the same calls stored twice, as the sink stores them (later prompts delta-encoded on the
previous call, a group's shared first prompt stored once, later request bodies stored as deltas on
their base's body) and with every prompt and request body in full, in the same table design (``CREATE
TABLE calls_full AS calls``, written through the same EPHEMERAL byte inputs); compressed bytes on disk
from system.columns and system.parts after merging, all parts wide as in production (the default makes
parts under 10 MB compact).

``stored_vs_full_prompts``, the headline, is what "stored bytes per token against storing every call's
full prompt" names: the bytes of the calls table's prompt columns (``prompt_*``: ids, new ids after the
delta base, the base's call id and shared length, the shared-prompt reference, length, sha256) against
the same columns holding every call's prompt whole. ``prompt_bytes_per_prompt_token`` and
``full_prompt_bytes_per_prompt_token`` are the same two as bytes per prompt token.

``calls_table_vs_full`` compares the whole calls table, prompt columns and all the rest: request bodies
(stored as deltas against full bodies), outputs, logprobs and response bodies (stored alike in both
tables). The columns no prompt storage touches bound it from below: ``calls_table_vs_full_if_prompts_free``
is the ratio the table would have if its prompt columns took no bytes at all. ``..._uncompressed`` is
what the network and memory would see.

Every call carries the harness request the gateway records (``--bodies chat``, the default): the whole
conversation so far as text, tool definitions and parameters, as an OpenAI chat harness sends it, so
the bodies grow with the rollout like the prompts. ``--bodies tiny`` puts placeholders there instead.
``token_columns_vs_full_prompts`` compares the token columns (prompt, output ids, logprobs) alone,
``request_bodies_vs_full`` the request body column alone.

Samples are stored as the sink stores them (ids and logprobs by reference to their calls where
proven equal) and again whole in ``samples_full``: ``samples_vs_full`` is their ratio on disk, and
``calls_and_samples_vs_full`` the ratio of both tables together.

Full prompts compress very differently per layout: ZSTD over packed bytes (the released 0001 layout)
finds a prompt's repeat of the previous one inside its 1 MB block, while T64's bit-transposed blocks
hide it. So the stored calls table is also compared with full prompts in the 0001 byte layout,
``calls_table_vs_full_bytes_layout``: the cheapest way to store full prompts we know, hence the
hardest baseline (with random synthetic ids the stored deltas are already at their entropy).

Options for storage studies (opt-in; the default run's figures are unchanged):
``--sweep-turns 4,8,12,24,48`` repeats the storage comparison (calls only, same groups and sizes) per
rollout length and adds ``stored_vs_full_prompts_by_turns`` and ``calls_table_vs_full_by_turns`` (and
its ``..._bytes_layout_by_turns``, ``..._uncompressed_by_turns``); ``--codecs`` re-stores
each token array column of the calls table under alternative codecs and prints bytes and insert speed;
``--ids zipf`` / ``--logprobs model`` draw token ids and logprobs like a real tokenizer and sampler
instead of uniformly (testkit/storage_records.py).

The rollouts of a group answer one task, so their first prompts (and first request bodies) are
identical, as in GRPO; the sink stores such a prompt once (sinks/shared_prompts.py). ``--task-prompt
distinct`` gives every rollout a first prompt of its own, the worst case for storage.

    python -m bench.sink [--groups N] [--turns T] [--sweep-turns 4,8,12] [--codecs] [--logprobs model]
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
from sinks.ddl import CALL_STORED_TOKEN_COLUMNS, TABLES, VERSION_SPAN_COLUMNS, migrate
from sinks.freshness import SRC_TIME_COLUMN
from sinks.request_bodies import CHECK_COLUMNS, DELTA_COLUMNS, RequestBodyDeltas
from sinks.rows import to_row
from sinks.sample_refs import SampleRefs
from sinks.shared_prompts import SharedPrompts
from sinks.store import insert_grouped
from testkit.storage_records import GroupSpec, synthetic_group

BATCH_ROWS = 2000


def encoded_events(
    groups: int,
    turns: int,
    prompt: int,
    turn: int,
    output: int,
    ids: str = "uniform",
    logprobs: str = "uniform",
    only: str | None = None,
    bodies: str = "chat",
    tools: int = 8,
    task_prompt: str = "shared",
) -> list[tuple[str, bytes]]:
    """Encoded events of ``groups`` synthetic groups of 8 rollouts (only those named ``only`` if given)."""
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
            ids=ids,
            logprobs=logprobs,
            bodies=bodies,
            tools=tools,
            task_prompt=task_prompt,
        )
        events = synthetic_group(spec).events
        out += [(name, codec.encode(name, rec)) for name, rec in events if only in (None, name)]
    return out


def ingest(client: object, messages: list[tuple[str, bytes]]) -> tuple[int, int, float]:
    """Decode, map and insert like the sink; returns (rows, call tokens, seconds)."""
    codec = get_codec()
    start = time.perf_counter()
    pending: dict[str, list[dict]] = {}
    rows = tokens = 0
    bodies = RequestBodyDeltas()
    samples = SampleRefs()
    shared = SharedPrompts()
    for _name, data in messages:
        name, record = codec.decode(data)
        table, row = to_row(name, record)
        if table == "calls":
            row = bodies.encode(row)
            samples.note_call(row)
        if name == "CallRecord":
            tokens += record["prompt"]["length"] + len(record["output_ids"]) // 4
        pending.setdefault(table, []).append(row)
        rows += 1
        if len(pending[table]) >= BATCH_ROWS:
            _insert_pending(client, pending, samples, shared)
    _insert_pending(client, pending, samples, shared)
    return rows, tokens, time.perf_counter() - start


def _insert_pending(
    client: object, pending: dict[str, list[dict]], samples: SampleRefs, shared: SharedPrompts
) -> None:
    """Every pending batch as the sink inserts it: samples reference the calls, calls inserted first,
    identical full prompts stored once."""
    insert_grouped(client, pending, samples, shared)  # type: ignore[arg-type]
    pending.clear()


def full_samples(client: object, messages: list[tuple[str, bytes]]) -> None:
    """The samples again in ``samples_full``, every token column stored whole (the design before 0006)."""
    codec = get_codec()
    client.command("CREATE TABLE samples_full AS samples")  # type: ignore[attr-defined]
    client.command("ALTER TABLE samples_full MODIFY SETTING min_bytes_for_wide_part = 0")  # type: ignore
    rows = [to_row(*codec.decode(data))[1] for name, data in messages if name == "Sample"]
    for i in range(0, len(rows), BATCH_ROWS):
        batch = rows[i : i + BATCH_ROWS]
        columns = list(batch[0])
        client.insert("samples_full", [[r[c] for c in columns] for r in batch], column_names=columns)  # type: ignore


FULL_TABLES = ("calls_full", "calls_full_bytes")
# Columns of the calls table added after the released 0001 design (calls_full_bytes lacks them).
RELEASED_LATER = (*CHECK_COLUMNS, "prompt_shared_call_id", "scripted")
# The full-prompt copies store every request body whole (calls_full keeps its length and sha256, as the
# same design; the released 0001 design has neither).


def full_prompt_calls(client: object) -> None:
    """Copy the calls table with every prompt stored in full (the naive layout), in the current design
    and in the released 0001 design (token ids as packed bytes, String + ZSTD)."""
    from sinks.store import CallTokenCache, select_rows

    client.command("CREATE TABLE calls_full AS calls")  # type: ignore[attr-defined]
    (v1,) = [t for t in TABLES if t.name == "calls"]
    client.command(dataclasses.replace(v1, name="calls_full_bytes").create_sql(client.database))  # type: ignore
    client.command("ALTER TABLE calls_full_bytes MODIFY SETTING min_bytes_for_wide_part = 0")  # type: ignore
    # Migration 0014's columns (version spans, release arm) are not about prompts: both layouts carry them,
    # so the ratio compares prompt storage, not a column count.
    # Nor is 0017's Kafka record time, nor 0018's subject (issue 31).
    for table, spec in [*VERSION_SPAN_COLUMNS, ("calls", SRC_TIME_COLUMN), ("calls", "subject Nullable(String)")]:
        if table == "calls":
            client.command(f"ALTER TABLE calls_full_bytes ADD COLUMN {spec.split(' AFTER ')[0]}")  # type: ignore
    cache = CallTokenCache(client)  # type: ignore[arg-type]
    rows = select_rows(client, "calls", columns="*")  # type: ignore[arg-type]
    cache.fetch(r["call_id"] for r in rows)
    batch = []
    for row in rows:
        full = full_prompt(cache.prompt(row["call_id"]))
        row = {
            k: v
            for k, v in row.items()
            if k not in ("event_time", "ingested_at", "output_tokens", "prompt_stored_tokens", *DELTA_COLUMNS)
        }
        row.update(prompt_ids=full["ids"], prompt_base_call_id=None, prompt_base_prefix_len=0, prompt_new_ids=None,
                   prompt_shared_call_id=None)
        batch.append(row)
        if len(batch) >= BATCH_ROWS:
            _insert_full(client, batch)
            batch = []
    _insert_full(client, batch)


def _insert_full(client: object, rows: list[dict]) -> None:
    if rows:
        for table in FULL_TABLES:
            columns = [c for c in rows[0] if table == "calls_full" or c not in RELEASED_LATER]
            client.insert(table, [[r[c] for c in columns] for r in rows], column_names=columns)  # type: ignore


def table_bytes(client: object, table: str) -> tuple[int, int]:
    """(compressed bytes on disk, uncompressed bytes) of a table's active parts."""
    return client.query(  # type: ignore[attr-defined]
        "SELECT sum(bytes_on_disk), sum(data_uncompressed_bytes) FROM system.parts "
        "WHERE database = currentDatabase() AND table = {t:String} AND active",
        parameters={"t": table},
    ).result_rows[0]


def prompt_column_bytes(client: object) -> dict[str, int]:
    """Compressed bytes of the prompt columns (``prompt_*``: ids, new ids, delta base, length, hash) per
    calls table: what storing every call's full prompt costs against the delta, the rest of the row aside."""
    return dict(client.query(  # type: ignore[attr-defined]
        "SELECT table, sum(data_compressed_bytes) FROM system.columns "
        "WHERE database = currentDatabase() AND name LIKE 'prompt%' GROUP BY table").result_rows)


def stored_ratios(client: object, messages: list[tuple[str, bytes]]) -> dict[str, float]:
    """Store ``messages`` in a freshly migrated database, then the same calls with full prompts in both
    baseline designs; the three ratios of the default run (stored / full prompts)."""
    migrate(client)  # type: ignore[arg-type]
    client.command("ALTER TABLE calls MODIFY SETTING min_bytes_for_wide_part = 0")  # type: ignore[attr-defined]
    ingest(client, messages)
    full_prompt_calls(client)
    for table in ("calls", *FULL_TABLES):
        client.command(f"OPTIMIZE TABLE {table} FINAL")  # type: ignore[attr-defined]
    delta_disk, delta_raw = table_bytes(client, "calls")
    full_disk, full_raw = table_bytes(client, "calls_full")
    bytes_disk, _ = table_bytes(client, "calls_full_bytes")
    prompts = prompt_column_bytes(client)
    return {
        "same_design": round(delta_disk / full_disk, 4),
        "prompt_columns": round(prompts["calls"] / prompts["calls_full"], 4),
        "bytes_layout": round(delta_disk / bytes_disk, 4),
        "uncompressed": round(delta_raw / full_raw, 4),
    }


def sweep_turns(dsn: str, turn_counts: list[int], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The storage ratios per rollout length, each in its own database of the same chDB path."""
    out: dict[str, dict[str, float]] = {}
    for turns in turn_counts:
        calls = encoded_events(
            args.groups, turns, args.prompt, args.turn, args.output, args.ids, args.logprobs, only="CallRecord",
            bodies=args.bodies, tools=args.tools, task_prompt=args.task_prompt,
        )
        client = connect(dsn=dsn, database=f"sweep_{turns}", create_database=True)
        out[str(turns)] = stored_ratios(client, calls)
    print(f"  {'turns':>5}  {'prompt columns':>14}  {'calls table':>11}  {'table, bytes layout':>19}"
          f"  {'uncompressed':>12}")
    for turns, r in out.items():
        print(f"  {turns:>5}  {r['prompt_columns']:>14.4f}  {r['same_design']:>11.4f}  {r['bytes_layout']:>19.4f}"
              f"  {r['uncompressed']:>12.4f}")
    return out


# Alternatives to the calls table's token array codecs (--codecs); the first of each list is current.
ID_CODECS = (
    "T64, ZSTD(3)",
    "T64, ZSTD(1)",
    "T64, ZSTD(9)",
    "T64",
    "T64('bit'), ZSTD(3)",
    "T64, LZ4HC(9)",
    "ZSTD(3)",
    "ZSTD(9)",
    "LZ4HC(9)",
    "Delta(4), ZSTD(3)",
    "Delta(4), T64, ZSTD(3)",
    "DoubleDelta, ZSTD(3)",
)
FLOAT_CODECS = (
    "ZSTD(3)",
    "ZSTD(1)",
    "ZSTD(5)",
    "ZSTD(7)",
    "ZSTD(9)",
    "ZSTD(19)",
    "LZ4HC(9)",
    "FPC",
    "FPC(12, 4)",
    "FPC, ZSTD(3)",
    "Gorilla",
    "Gorilla, ZSTD(3)",
    "Delta(4), ZSTD(3)",
)
CODEC_COLUMNS = (
    ("prompt_ids_arr", "UInt32", ID_CODECS),
    ("prompt_new_ids_arr", "UInt32", ID_CODECS),
    ("output_ids_arr", "UInt32", ID_CODECS),
    ("output_logprobs_arr", "Float32", FLOAT_CODECS),
)


def codec_table(client: object, repeat: int = 3) -> dict[str, dict[str, dict[str, float]]]:
    """Each stored token array column of ``calls`` copied (in table order) into a one-column table per
    codec: bytes on disk after merging, and the best insert speed (MB of uncompressed values per s;
    the read of the source column is the same for every codec of a column)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    order = "rollout_id, attempt_id, call_index"
    for column, element, codecs in CODEC_COLUMNS:
        raw = client.query(f"SELECT sum(length({column})) * 4 FROM calls").result_rows[0][0]  # type: ignore
        out[column] = {}
        for codec in codecs:
            client.command("DROP TABLE IF EXISTS codec_probe")  # type: ignore[attr-defined]
            client.command(  # type: ignore[attr-defined]
                f"CREATE TABLE codec_probe (v Array({element}) CODEC({codec})) ENGINE = MergeTree "
                "ORDER BY tuple() SETTINGS min_bytes_for_wide_part = 0"
            )
            best = float("inf")
            for _ in range(repeat):
                client.command("TRUNCATE TABLE codec_probe")  # type: ignore[attr-defined]
                start = time.perf_counter()
                client.command(f"INSERT INTO codec_probe SELECT {column} FROM calls ORDER BY {order}")  # type: ignore
                best = min(best, time.perf_counter() - start)
            client.command("OPTIMIZE TABLE codec_probe FINAL")  # type: ignore[attr-defined]
            size = client.query(  # type: ignore[attr-defined]
                "SELECT sum(data_compressed_bytes) FROM system.columns "
                "WHERE database = currentDatabase() AND table = 'codec_probe'"
            ).result_rows[0][0]
            out[column][codec] = {"bytes": int(size), "bits_per_value": round(8 * size / max(raw / 4, 1), 2),
                                  "insert_mb_s": round(raw / 1e6 / best, 1)}
        client.command("DROP TABLE IF EXISTS codec_probe")  # type: ignore[attr-defined]
    for column, rows in out.items():
        base = next(iter(rows.values()))["bytes"]
        print(f"  {column}")
        for codec, r in rows.items():
            print(f"    {codec:<24} {r['bytes']:>10,}  {r['bytes'] / base:6.3f}x  {r['bits_per_value']:6.2f} bit/value"
                  f"  {r['insert_mb_s']:8.1f} MB/s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=2, help="groups of 8 rollouts")
    parser.add_argument("--turns", type=int, default=12, help="calls per rollout")
    parser.add_argument("--prompt", type=int, default=4000, help="first prompt tokens")
    parser.add_argument("--turn", type=int, default=1000, help="tool-result tokens added per turn")
    parser.add_argument("--output", type=int, default=300, help="sampled tokens per call")
    parser.add_argument("--ids", choices=("uniform", "zipf"), default="uniform", help="token id distribution")
    parser.add_argument("--logprobs", choices=("uniform", "model"), default="uniform", help="logprob distribution")
    parser.add_argument("--bodies", choices=("chat", "tiny"), default="chat",
                        help="harness request bodies: the conversation as text (chat) or placeholders (tiny)")
    parser.add_argument("--tools", type=int, default=8, help="tool definitions in every chat request body")
    parser.add_argument("--task-prompt", choices=("shared", "distinct"), default="shared",
                        help="first prompts: one per group, as GRPO rollouts of one task have (shared), "
                        "or one per rollout, the storage worst case (distinct)")
    parser.add_argument("--sweep-turns", default="", help="comma-separated rollout lengths, e.g. 4,8,12,24,48")
    parser.add_argument("--codecs", action="store_true", help="compare codecs of the calls' token arrays")
    args = parser.parse_args()
    sweep = [int(t) for t in args.sweep_turns.split(",") if t.strip()]

    messages = encoded_events(
        args.groups, args.turns, args.prompt, args.turn, args.output, args.ids, args.logprobs,
        bodies=args.bodies, tools=args.tools, task_prompt=args.task_prompt,
    )
    extra: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sink-") as tmp:
        dsn = f"chdb://{tmp}"
        client = connect(dsn=dsn, database="bench", create_database=True)
        migrate(client)
        # Wide parts keep per-column sizes in system.columns (small parts are otherwise compact).
        client.command("ALTER TABLE calls MODIFY SETTING min_bytes_for_wide_part = 0")
        client.command("ALTER TABLE samples MODIFY SETTING min_bytes_for_wide_part = 0")
        rows, tokens, seconds = ingest(client, messages)
        full_prompt_calls(client)
        full_samples(client, messages)
        for table in ("calls", *FULL_TABLES, "samples", "samples_full"):
            client.command(f"OPTIMIZE TABLE {table} FINAL")
        samples_disk, _ = table_bytes(client, "samples")
        samples_full_disk, _ = table_bytes(client, "samples_full")
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
        n_calls, logical, prompt_tokens = client.query(
            "SELECT count(), sum(prompt_length + output_tokens), sum(prompt_length) FROM calls").result_rows[0]
        all_disk = client.query(
            "SELECT sum(bytes_on_disk) FROM system.parts WHERE database = currentDatabase() "
            "AND active AND table NOT IN ('calls_full', 'calls_full_bytes', 'samples_full')"
        ).result_rows[0][0]
        sample_tokens = client.query("SELECT sum(tokens) FROM samples").result_rows[0][0]
        request_bytes = dict(
            client.query(
                "SELECT table, sum(data_compressed_bytes) FROM system.columns "
                "WHERE database = currentDatabase() AND name = 'request_json' GROUP BY table"
            ).result_rows
        )
        token_columns = dict(
            client.query(
                "SELECT table, sum(data_compressed_bytes) FROM system.columns "
                "WHERE database = currentDatabase() "
                "AND (name IN ('prompt_ids', 'prompt_new_ids', 'output_ids', 'output_logprobs') "
                "OR name IN {stored:Array(String)}) GROUP BY table",
                parameters={"stored": list(CALL_STORED_TOKEN_COLUMNS)},
            ).result_rows
        )
        prompts = prompt_column_bytes(client)
        if args.codecs:
            extra["codec_bytes"] = codec_table(client)
        if sweep:
            by_turns = sweep_turns(dsn, sweep, args)
            extra["calls_table_vs_full_uncompressed_by_turns"] = {t: r["uncompressed"] for t, r in by_turns.items()}
            extra["calls_table_vs_full_bytes_layout_by_turns"] = {t: r["bytes_layout"] for t, r in by_turns.items()}
            extra["calls_table_vs_full_by_turns"] = {t: r["same_design"] for t, r in by_turns.items()}
            extra["stored_vs_full_prompts_by_turns"] = {t: r["prompt_columns"] for t, r in by_turns.items()}
    if args.ids != "uniform" or args.logprobs != "uniform":
        extra["distributions"] = f"ids={args.ids} logprobs={args.logprobs}"
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
            "request_body_bytes_delta": int(request_bytes.get("calls", 0)),
            "request_body_bytes_full": int(request_bytes.get("calls_full", 0)),
            "request_bodies_vs_full": round(
                request_bytes.get("calls", 0) / max(request_bytes.get("calls_full", 1), 1), 4
            ),
            "prompt_column_bytes_delta": int(prompts["calls"]),
            "prompt_column_bytes_full": int(prompts["calls_full"]),
            "prompt_bytes_per_prompt_token": round(prompts["calls"] / prompt_tokens, 4),
            "full_prompt_bytes_per_prompt_token": round(prompts["calls_full"] / prompt_tokens, 4),
            "token_columns_vs_full_prompts": round(
                token_columns.get("calls", 0) / max(token_columns.get("calls_full", 1), 1), 4
            ),
            "bodies": args.bodies,
            "task_prompt": args.task_prompt,
            "part_types": part_types,
            "calls_bytes_per_token": round(delta_disk / logical, 4),
            "all_tables_bytes_per_call_token": round(all_disk / logical, 4),
            "sample_tokens": int(sample_tokens),
            "samples_bytes": int(samples_disk),
            "samples_bytes_full": int(samples_full_disk),
            "samples_vs_full": round(samples_disk / samples_full_disk, 4),
            "calls_and_samples_vs_full": round((delta_disk + samples_disk) / (full_disk + samples_full_disk), 4),
            "calls_table_vs_full": round(delta_disk / full_disk, 4),
            "calls_table_vs_full_if_prompts_free": round((delta_disk - prompts["calls"]) / full_disk, 4),
            "calls_table_vs_full_uncompressed": round(delta_raw / full_raw, 4),
            "calls_table_vs_full_bytes_layout": round(delta_disk / bytes_disk, 4),
            **extra,
            "stored_vs_full_prompts": round(prompts["calls"] / prompts["calls_full"], 4),
        }
    )


if __name__ == "__main__":
    np.seterr(all="raise")
    main()
