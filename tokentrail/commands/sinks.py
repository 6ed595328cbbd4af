"""Commands of the ClickHouse side: `clickhouse migrate|ddl|readonly-user|counts`, `sink`, `audit`,
`trace`, `report`, `replay`. Registered through tokentrail/cli.py COMMANDS; the work is in ``sinks``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from clickhouse_connect.driver.client import Client

from sinks.client import ClickHouseConfigError, connect, is_embedded
from tokentrail.errors import CliError
from tokentrail.settings import get_settings


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dsn", help="chdb:///abs/dir or http(s)://host:8123 (default: settings clickhouse.dsn)")
    p.add_argument("--database", help="database name (default: settings clickhouse.database)")


def _client(args: argparse.Namespace, create: bool = False) -> Client:
    try:
        return connect(get_settings().clickhouse, dsn=args.dsn, database=args.database, create_database=create)
    except ClickHouseConfigError as exc:
        raise CliError(str(exc)) from exc


# ---- clickhouse ----------------------------------------------------------------------------------


def _migrate(args: argparse.Namespace) -> int:
    from sinks.ddl import TABLE_NAMES, VIEWS, migrate

    client = _client(args, create=True)
    applied = migrate(client)
    print(
        f"database {client.database}: {len(TABLE_NAMES)} tables, {len(VIEWS)} views; "
        f"applied {', '.join(applied) if applied else 'nothing new (up to date)'}"
    )
    return 0


def _ddl(args: argparse.Namespace) -> int:
    from sinks.ddl import schema_sql

    sys.stdout.write(schema_sql(args.database or get_settings().clickhouse.database))
    return 0


def _readonly_user(args: argparse.Namespace) -> int:
    from sinks.ddl import readonly_user_sql

    settings = get_settings().clickhouse
    db = args.database or settings.database
    user = args.user or settings.readonly_user
    statements = readonly_user_sql(db, user, hashlib.sha256(args.password.encode()).hexdigest())
    if args.print_only:
        print(";\n".join(statements) + ";")
        return 0
    client = _client(args)
    if is_embedded(client):
        raise CliError(
            "chDB (embedded) has no users or grants: a read-only dashboard user exists only on a "
            "ClickHouse server. Use --print to see the SQL, or point --dsn at a server."
        )
    for statement in statements:
        client.command(statement)
    print(f"user {user}: read-only (readonly=1), SELECT on {db}.*")
    return 0


def _counts(args: argparse.Namespace) -> int:
    from sinks.store import table_counts

    for table, n in table_counts(_client(args)).items():
        print(f"{table:<18} {n}")
    return 0


# ---- sink ----------------------------------------------------------------------------------------


def _sink(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AdminClient

    from schemas.kafka.config import admin_config
    from schemas.kafka.topic_admin import ensure_topics
    from sinks.ddl import migrate
    from sinks.sink import SinkOptions, run_sink

    settings = get_settings()
    client = _client(args, create=True)
    migrate(client)
    report = ensure_topics(AdminClient(admin_config(settings.kafka)), settings.kafka)
    for difference in report.differences:
        print(f"sink: warning: {difference.describe()}", file=sys.stderr)
    options = SinkOptions(
        group_id=args.group_id,
        batch_rows=args.batch_rows,
        flush_interval_s=args.flush_interval,
        once=args.once,
        idle_s=args.until_idle,
        progress_every_s=args.progress_every,
        **({"request_memo_chars": args.request_memo_chars} if args.request_memo_chars is not None else {}),
        **({"sample_memo_calls": args.sample_memo_calls} if args.sample_memo_calls is not None else {}),
        **({"shared_prompt_memo": args.shared_prompt_memo} if args.shared_prompt_memo is not None else {}),
    )
    stats = run_sink(client, settings.kafka, options)
    return 0 if stats.dead_letters == 0 or not args.fail_on_dead_letters else 1


# ---- audit / trace / report ----------------------------------------------------------------------


def _audit(args: argparse.Namespace) -> int:
    from sinks.audit import CHECKS, format_table, run_audit

    unknown = [c for c in args.check or [] if c not in CHECKS]
    if unknown:
        raise CliError(f"unknown check(s) {unknown}; known: {sorted(CHECKS)}")
    results = run_audit(_client(args), only=args.check)
    if args.json:
        print(
            json.dumps({"passed": all(r.passed for r in results), "checks": [r.to_dict() for r in results]}, indent=2)
        )
    else:
        print(format_table(results))
    return 0 if all(r.passed for r in results) else 1


def _trace(args: argparse.Namespace) -> int:
    from sinks.trace import TraceError, format_trace, trace_sample

    try:
        trace = trace_sample(_client(args), args.sample_id, args.position)
    except TraceError as exc:
        raise CliError(str(exc)) from exc
    print(json.dumps(trace, indent=2, default=str) if args.json else format_trace(trace))
    return 0


def _report(args: argparse.Namespace) -> int:
    from sinks.report import write_report

    out = write_report(_client(args), Path(args.out), audit=not args.no_audit)
    print(f"wrote {out}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from processors.errors import ProcessorError
    from processors.pipeline import StageConfigs
    from sinks.replay import publish, replay
    from sinks.store import write_records

    settings = get_settings()
    p = settings.processors
    if args.feedback:
        return _replay_feedback(args)
    if args.baselines:
        return _replay_baselines(args)
    try:
        configs = StageConfigs.load(
            args.reward or p.reward_config, args.credit or p.credit_config, args.sample or p.sample_config
        )
    except (ProcessorError, OSError) as exc:
        raise CliError(f"configuration: {exc}") from exc
    client = _client(args)
    result = replay(client, configs, args.group or None, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(
        f"configs: reward {result.configs['reward']}, credit {result.configs['credit']}, "
        f"sample {result.configs['sample']}"
    )
    print(f"{result.groups} groups re-derived: " + ", ".join(f"{n} {k}" for k, n in sorted(result.counts().items())))
    for group_event_id, reason in result.skipped:
        print(f"skipped group {group_event_id}: {reason}", file=sys.stderr)
    if result.forgotten_rollouts:
        print(f"replay: {len(result.forgotten_rollouts)} rollouts could not be re-derived: their content was "
              "forgotten", file=sys.stderr)
    if result.rewritten_scores:
        print(
            f"warning: {len(result.rewritten_scores)} raw score(s) were rewritten; the first stored content "
            f"was used ({', '.join(result.rewritten_scores[:5])})",
            file=sys.stderr,
        )
    if args.dry_run:
        print("dry run: nothing written")
    elif args.to == "clickhouse":
        counts = write_records(client, result.events)
        print(f"inserted into ClickHouse: {counts}")
    else:
        print(f"produced {publish(result.events, settings.kafka)} events to Kafka")
    return 0


def _replay_feedback(args: argparse.Namespace) -> int:
    """``replay --feedback``: feedback rewards re-derived by event time, side by side with the stream's."""
    from processors.errors import ProcessorError
    from processors.feedback.config import load_feedback_config
    from sinks.replay import format_feedback_replay, publish, replay_feedback
    from sinks.store import write_records

    settings = get_settings()
    try:
        cfg = load_feedback_config(args.feedback_config or settings.processors.feedback_config)
    except (ProcessorError, OSError) as exc:
        raise CliError(f"feedback configuration: {exc}") from exc
    client = _client(args)
    result = replay_feedback(client, cfg, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(format_feedback_replay(result))
    if args.dry_run:
        print("dry run: nothing written")
    elif args.to == "clickhouse":
        print(f"inserted into ClickHouse: {write_records(client, result.events)}")
    else:
        print(f"produced {publish(result.events, settings.kafka)} feedback rewards to Kafka")
    return 0


def _replay_baselines(args: argparse.Namespace) -> int:
    """``replay --baselines``: baseline windows and what is measured against them, from stored rollouts and
    feedback rewards (docs/feedback.md, "Baselines without siblings")."""
    from processors.baselines.config import BaselineConfig
    from processors.config import load_config
    from processors.errors import ProcessorError
    from processors.pipeline import StageConfigs
    from sinks.replay import publish, replay_baselines
    from sinks.store import write_records

    settings = get_settings()
    p = settings.processors
    try:
        cfg = load_config(BaselineConfig, args.baseline_config or p.baseline_config)
        configs = StageConfigs.load(
            args.reward or p.reward_config, args.credit or p.credit_config, args.sample or p.sample_config
        )
    except (ProcessorError, OSError) as exc:
        raise CliError(f"configuration: {exc}") from exc
    client = _client(args)
    result = replay_baselines(client, cfg, configs, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"baseline config {result.config_id}: {result.members} rollouts measured: "
          + ", ".join(f"{n} {k}" for k, n in sorted(result.counts().items())))
    if args.dry_run:
        print("dry run: nothing written")
    elif args.to == "clickhouse":
        print(f"inserted into ClickHouse: {write_records(client, result.events)}")
    else:
        print(f"produced {publish(result.events, settings.kafka)} events to Kafka")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    ch = sub.add_parser("clickhouse", help="ClickHouse schema: migrate, print DDL, dashboard user, counts")
    ch_sub = ch.add_subparsers(dest="clickhouse_command", metavar="ACTION")
    p = ch_sub.add_parser("migrate", help="create database, tables and views (idempotent)")
    _add_target(p)
    p.set_defaults(func=_migrate)
    p = ch_sub.add_parser("ddl", help="print the full DDL as SQL (for a server)")
    p.add_argument("--database")
    p.set_defaults(func=_ddl)
    p = ch_sub.add_parser("readonly-user", help="create the read-only dashboard user (server only; chDB has no users)")
    _add_target(p)
    p.add_argument("--user", help="user name (default: settings clickhouse.readonly_user)")
    p.add_argument("--password", required=True)
    p.add_argument("--print", dest="print_only", action="store_true", help="print the SQL instead of running it")
    p.set_defaults(func=_readonly_user)
    p = ch_sub.add_parser("counts", help="events per table (deduplicated)")
    _add_target(p)
    p.set_defaults(func=_counts)
    ch.set_defaults(func=lambda _a: (ch.print_help(), 2)[1])

    p = sub.add_parser("sink", help="consume every topic into ClickHouse (at-least-once, deduplicated)")
    _add_target(p)
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--once", action="store_true", help="stop when every partition is read to its end")
    stop.add_argument(
        "--until-idle",
        type=float,
        nargs="?",
        const=5.0,
        metavar="SECONDS",
        help="stop after SECONDS (default 5) without a new message",
    )
    p.add_argument("--group-id", default="tokentrail-clickhouse-sink")
    p.add_argument("--batch-rows", type=int, default=5000)
    p.add_argument("--flush-interval", type=float, default=1.0, help="seconds between inserts at most")
    p.add_argument("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    p.add_argument(
        "--request-memo-chars", type=int, metavar="N",
        help="characters of recent request bodies kept as bases for later calls' bodies, which are then "
        "stored as deltas (default 64,000,000)",
    )
    p.add_argument(
        "--sample-memo-calls", type=int, metavar="N",
        help="recent calls remembered (as hashes) so that samples repeating their tokens are stored as "
        "references to them (default 200,000; 0 stores every sample whole)",
    )
    p.add_argument(
        "--shared-prompt-memo", type=int, metavar="N",
        help="stored full prompts remembered (as hashes) so that a call with the same full prompt, as "
        "the rollouts of a group have, stores it once, by reference (default 100,000; 0: every prompt whole)",
    )
    p.add_argument("--fail-on-dead-letters", action="store_true", help="exit 1 if any message was dead-lettered")
    p.set_defaults(func=_sink)

    p = sub.add_parser("audit", help="the five audit checks (incl. feedback accounting); exit 1 on a failure")
    _add_target(p)
    p.add_argument("--json", action="store_true", help="machine-readable output with every failing id")
    p.add_argument("--check", action="append", help="run only this check (repeatable)")
    p.set_defaults(func=_audit)

    p = sub.add_parser(
        "trace",
        help="trainer step <- sample <- call <- prompt <- rollout <- group <- score <- "
        "reward <- credit, for one sample (and token position)",
    )
    _add_target(p)
    p.add_argument("sample_id")
    p.add_argument("position", nargs="?", type=int, help="token position inside the sample")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_trace)

    p = sub.add_parser(
        "replay",
        help="re-derive rewards, credits and samples under new configs from stored "
        "scores and rollouts (no environment or verifier runs)",
    )
    _add_target(p)
    p.add_argument("--reward", help="reward config YAML (default: settings processors.reward_config)")
    p.add_argument("--credit", help="credit config YAML (default: settings processors.credit_config)")
    p.add_argument("--sample", help="sample config YAML (default: settings processors.sample_config)")
    p.add_argument("--group", action="append", help="only this group id (repeatable)")
    p.add_argument(
        "--to",
        choices=("kafka", "clickhouse"),
        default="kafka",
        help="kafka: produce to the topics (the sink stores them); clickhouse: insert directly",
    )
    p.add_argument("--dry-run", action="store_true", help="derive and summarize, write nothing")
    p.add_argument("--feedback", action="store_true",
                   help="re-derive feedback rewards by event time instead (late feedback within its kind's wait "
                   "counts), printed beside the stream's; the replayed rewards have ids of their own")
    p.add_argument("--feedback-config", help="feedback-reward config YAML (default: settings "
                   "processors.feedback_config)")
    p.add_argument("--baselines", action="store_true",
                   help="re-derive the baselines without siblings (Baseline events, and the rewards, credits and "
                   "samples measured against them) from stored rollouts and feedback rewards")
    p.add_argument("--baseline-config", help="baseline config YAML (default: settings processors.baseline_config)")
    p.set_defaults(func=_replay)

    p = sub.add_parser("report", help="self-contained HTML report (plots embedded) incl. reward vs policy version")
    _add_target(p)
    p.add_argument("--out", default="report.html")
    p.add_argument("--no-audit", action="store_true", help="leave the audit section out")
    p.set_defaults(func=_report)
