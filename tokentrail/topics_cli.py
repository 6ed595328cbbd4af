"""``tokentrail topics ensure|list``: create and check the topics declared in schemas/topics.py."""

from __future__ import annotations

import argparse

from confluent_kafka.admin import AdminClient

from schemas.kafka.config import admin_config
from schemas.kafka.topic_admin import ensure_topics
from schemas.topics import ALL_TOPICS, DAY_MS, FOREVER
from tokentrail.errors import CliError
from tokentrail.kafka_local import broker_answers
from tokentrail.settings import Settings, get_settings


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "topics",
        help="create or list tokentrail's Kafka topics",
        description="The topics declared in schemas/topics.py, on the broker at "
        "settings.kafka.bootstrap_servers.",
    )
    actions = parser.add_subparsers(dest="topics_action", metavar="ACTION", required=True)

    p_ensure = actions.add_parser(
        "ensure",
        help="create missing topics and check existing ones",
        description="Create every missing topic; report existing topics whose partition count or "
        "configs differ from their spec. Exit 1 while differences remain.",
    )
    p_ensure.add_argument("--fix-configs", action="store_true",
                          help="set differing topic configs (retention, sizes, compression) to the spec; "
                          "partition counts are never changed")
    p_ensure.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                          help="admin request timeout (default: 30)")
    p_ensure.set_defaults(func=_cmd_ensure)

    p_list = actions.add_parser(
        "list",
        help="list the declared topics and whether they exist",
        description="Print each declared topic: key, partitions (declared / on the broker), retention.",
    )
    p_list.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="admin request timeout (default: 10)")
    p_list.set_defaults(func=_cmd_list)


def _admin(settings: Settings, timeout_s: float) -> AdminClient:
    if not broker_answers(settings.kafka, timeout=timeout_s):
        raise CliError(
            f"no Kafka broker answers on {settings.kafka.bootstrap_servers}; "
            "start the local one with `tokentrail kafka start`"
        )
    return AdminClient(admin_config(settings.kafka))


def _cmd_ensure(args: argparse.Namespace) -> int:
    settings = get_settings()
    report = ensure_topics(_admin(settings, args.timeout), settings.kafka, fix_configs=args.fix_configs,
                           timeout_s=args.timeout)
    for name in report.created:
        print(f"created  {name}")
    for name in report.existing:
        print(f"exists   {name}")
    for fix in report.altered:
        print(f"set      {fix.topic}: {fix.setting} {fix.actual} -> {fix.expected}")
    for difference in report.differences:
        print(f"DIFFERS  {difference.describe()}")
    if not report.ok:
        hint = "" if args.fix_configs else " (--fix-configs sets topic configs)"
        print(f"{len(report.differences)} difference(s){hint}")
        return 1
    print(f"{len(ALL_TOPICS)} topics ok ({len(report.created)} created)")
    return 0


def _retention(ms: int) -> str:
    if ms == FOREVER:
        return "forever"
    return f"{ms / DAY_MS:g} d" if ms % DAY_MS == 0 else f"{ms} ms"


def _cmd_list(args: argparse.Namespace) -> int:
    settings = get_settings()
    admin = _admin(settings, args.timeout)
    present = admin.list_topics(timeout=args.timeout).topics
    rows = [("topic", "key", "partitions", "on broker", "retention")]
    for spec in ALL_TOPICS:
        actual = str(len(present[spec.name].partitions)) if spec.name in present else "missing"
        declared = str(spec.partition_count(settings.kafka))
        rows.append((spec.name, spec.key, declared, actual, _retention(spec.retention_ms)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0
