"""The ClickHouse sink as a child process on a pipeline's prefixed topics, and a read-back of what it stored.

    python -m reliability.sink_child run   --prefix P --dsn chdb:///dir --group G [--idle-s 4]
    python -m reliability.sink_child query --dsn chdb:///dir

``run`` is the real sink (sinks.sink.run_sink) reading the pipeline's copies of every topic. ``query``
prints one JSON object: per table the raw row count, the count after FINAL and the distinct event ids
after FINAL, the event ids themselves, and every dead letter. Both run in their own process because
chDB allows one engine directory per process and one process per directory (a kill -9 frees it).
Kafka settings come from the TOKENTRAIL_* environment (tokentrail.runtime.process.settings_env).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

DATABASE = "reliability"


def topic_map(prefix: str) -> tuple[dict[str, tuple[str, ...]], str]:
    from processors.stream.topics import OUTPUT_SPECS
    from schemas import topics as T

    specs = [T.CALLS, T.ENV, *OUTPUT_SPECS.values()]
    return {prefix + s.name: s.value_schemas for s in specs}, prefix + T.DEAD_LETTER.name


def _run(args: argparse.Namespace) -> int:
    from sinks.client import connect
    from sinks.ddl import migrate
    from sinks.sink import SinkOptions, run_sink
    from tokentrail.settings import get_settings

    client = connect(dsn=args.dsn, database=DATABASE, create_database=True)
    migrate(client)
    topics, dead = topic_map(args.prefix)
    options = SinkOptions(group_id=args.group, batch_rows=args.batch_rows, flush_interval_s=0.5,
                          idle_s=args.idle_s, progress_every_s=0.5)
    print("sink ready", flush=True)
    run_sink(client, get_settings().kafka, options, topic_map=topics, dead_letter_topic=dead,
             log=lambda line: print(line, flush=True))
    return 0


def _query(args: argparse.Namespace) -> int:
    from sinks.client import connect
    from sinks.ddl import TABLE_NAMES

    client = connect(dsn=args.dsn, database=DATABASE)
    out: dict[str, Any] = {"tables": {}, "ids": {}, "dead_letters": []}
    for table in TABLE_NAMES:
        raw = client.query(f"SELECT count() FROM {table}").result_rows[0][0]
        final, unique = client.query(f"SELECT count(), uniqExact(event_id) FROM {table} FINAL").result_rows[0]
        out["tables"][table] = {"raw": int(raw), "final": int(final), "unique": int(unique)}
        out["ids"][table] = [r[0] for r in client.query(f"SELECT event_id FROM {table} FINAL").result_rows]
    rows = client.query("SELECT stage, source_topic, key, error_type, reason FROM dead_letters FINAL").result_rows
    out["dead_letters"] = [{"stage": s, "source_topic": t, "key": k, "error_type": e, "reason": r}
                           for s, t, k, e, r in rows]
    print(json.dumps(out))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.sink_child", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="run the sink on PREFIX + every topic until idle")
    run.add_argument("--prefix", required=True)
    run.add_argument("--dsn", required=True)
    run.add_argument("--group", required=True)
    run.add_argument("--idle-s", type=float, default=4.0)
    run.add_argument("--batch-rows", type=int, default=200)
    run.set_defaults(func=_run)
    query = sub.add_parser("query", help="print what the sink stored, as JSON")
    query.add_argument("--dsn", required=True)
    query.set_defaults(func=_query)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
