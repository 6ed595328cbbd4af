"""`tokentrail scan-residue`: look for readable content of forgotten subjects in every store.

Registered through tokentrail/cli.py COMMANDS; the scan is ``tokentrail.residue_scan``. Progress goes to
stderr, the locations found and the last line (one JSON object, ``residual_readable`` first) to stdout.
Exit 0: every store read to its end and nothing readable found; 1: something readable remains, or a store
could not be read to its end (then a zero proves nothing); 2: bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from schemas.residue import Needles
from tokentrail.errors import CliError


def _token_run(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.replace(" ", ",").split(",") if t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"token run {text!r} is not a comma-separated list of ids") from None


def _needles(args: argparse.Namespace) -> Needles:
    canaries = list(args.canary)
    runs = list(args.tokens)
    subjects = list(args.subject)
    if args.needles:
        try:
            data = json.loads(Path(args.needles).read_text())
            loaded = Needles.from_json(data)
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot read needles from {args.needles}: {exc}") from exc
        canaries += loaded.canaries
        runs += loaded.token_runs
        subjects += loaded.subjects
    # Key ids name what records carry: a subject's pseudonym, or its name in records older than pseudonyms.
    from schemas.subject_names import SubjectNames
    from tokentrail.settings import get_settings

    names = SubjectNames(get_settings().forget.master())
    try:
        return Needles(tuple(canaries), tuple(runs), tuple(dict.fromkeys(f for s in subjects for f in names.forms(s))))
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def _scan(args: argparse.Namespace) -> int:
    from schemas.kafka.residue import TopicSelection
    from sinks.client import ClickHouseConfigError
    from tokentrail.residue_scan import ScanTargets, scan_residue

    needles = _needles(args)
    targets = ScanTargets(
        kafka=not args.no_kafka, topics=TopicSelection(args.topics, tuple(args.topic)),
        kafka_timeout_s=args.kafka_timeout_s, spool=not args.no_spool,
        spool_dirs=tuple(args.spool) or None, clickhouse=not args.no_clickhouse, dsn=args.dsn,
        database=args.database, reports=tuple(args.report) or (() if args.no_reports else None),
        paths=tuple(args.path))
    began = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - began:6.1f}s] {line}", file=sys.stderr, flush=True)

    try:
        tally = scan_residue(needles, targets, progress=progress)
    except ClickHouseConfigError as exc:
        raise CliError(str(exc)) from exc
    summary = tally.summary(max_locations=args.max_locations)
    for location in summary["locations"]:
        print(f"readable: {location['store']} {location['where']}  {', '.join(location['needles'])} "
              f"in {', '.join(location['fields'])}")
    for reason in tally.incomplete:
        print(f"incomplete: {reason}")
    summary["elapsed_s"] = round(time.monotonic() - began, 2)
    print(json.dumps(summary))
    return 0 if tally.residual_readable == 0 and tally.complete else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scan-residue",
        help="find readable content of forgotten subjects (canaries, token runs) in topics, spool, ClickHouse, reports",
        description="Scan every partition of every tokentrail topic (raw keys, values, headers and decoded records), "
        "the gateway spool, every ClickHouse table and the HTML reports for planted canary strings and the subjects' "
        "token runs. Last line: one JSON object with residual_readable (locations with readable content). "
        "Exit 0 only when every store was read to its end and nothing readable was found.")
    p.add_argument("--canary", action="append", default=[], metavar="TEXT", help="a planted string (repeatable)")
    p.add_argument("--tokens", action="append", default=[], type=_token_run, metavar="ID,ID,...",
                   help="a subject's token run, at least 4 ids (repeatable)")
    p.add_argument("--subject", action="append", default=[], metavar="S",
                   help="a forgotten subject: a data key of it still live in a key topic counts as residue "
                   "(repeatable)")
    p.add_argument("--needles", metavar="FILE",
                   help='JSON file {"canaries": [...], "token_runs": [[...], ...], "subjects": [...]} '
                   "(added to the flags)")
    p.add_argument("--topics", default="tokentrail", metavar="REGEX",
                   help="scan the topics whose name matches (default: tokentrail, which also takes the "
                   "processors' changelogs and prefixed runs' topics)")
    p.add_argument("--topic", action="append", default=[], metavar="NAME",
                   help="scan exactly these topics instead (repeatable)")
    p.add_argument("--kafka-timeout-s", type=float, default=600.0,
                   help="give up on partitions not read to their end by then (the scan is then incomplete)")
    p.add_argument("--spool", action="append", default=[], type=Path, metavar="DIR",
                   help="spool directory (repeatable; default: settings gateway.spool_dir)")
    p.add_argument("--report", action="append", default=[], type=Path, metavar="FILE",
                   help="report file (repeatable; default: every *.html under settings var_dir)")
    p.add_argument("--path", action="append", default=[], type=Path, metavar="PATH",
                   help="a further file or folder to search raw (local caches, exports, copies of topics; repeatable)")
    p.add_argument("--dsn", help="chdb:///abs/dir or http(s)://host:8123 (default: settings clickhouse.dsn)")
    p.add_argument("--database", help="database name (default: settings clickhouse.database)")
    p.add_argument("--no-kafka", action="store_true", help="leave Kafka out")
    p.add_argument("--no-spool", action="store_true", help="leave the spool out")
    p.add_argument("--no-clickhouse", action="store_true", help="leave ClickHouse out")
    p.add_argument("--no-reports", action="store_true", help="leave the reports out")
    p.add_argument("--max-locations", type=int, default=50, help="locations to list (the count is always exact)")
    p.set_defaults(func=_scan)
