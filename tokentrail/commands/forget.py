"""``tokentrail forget --subject S``: forget a user or tenant across the event log (docs/forgetting.md).

1. destroy the subject's data keys (tombstones on the compacted key topic) and publish the immutable
   ``Forgotten`` event (who asked, when, which subject and keys; no content), directly or through a running
   gateway's ``POST /v1/admin/forget`` (``--gateway``, which also drops the gateway's in-memory copies);
2. blank the subject's content in ClickHouse (every sink blanks it too when it stores the event);
3. wait until every process has re-read the key topic (``forget.refresh_s``): from then on no process opens
   the subject's content, in any topic, replay, spool or backup.
The last line is one JSON object: the requests, keys destroyed and rows blanked.
"""

from __future__ import annotations

import argparse
import getpass
import json

from tokentrail.errors import CliError
from tokentrail.forgetting import expire, forget
from tokentrail.settings import get_settings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "forget", help="forget a subject: destroy its keys, blank its stored content, record a Forgotten event",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subject", action="append", default=[], help="the subject (user or tenant key); repeatable")
    p.add_argument("--expire", action="store_true",
                   help="retention instead: destroy the data keys past forget.content_retention_days / "
                        "tenant_retention_days and blank ClickHouse content past it (run it daily)")
    p.add_argument("--requested-by", default=None, help="who asks (default: the OS user)")
    p.add_argument("--reason", default="", help="why (kept on the Forgotten event; no personal data here)")
    p.add_argument("--gateway", default=None, help="forget through this running gateway's admin route (URL)")
    p.add_argument("--no-clickhouse", action="store_true", help="leave ClickHouse to the sinks")
    p.add_argument("--dsn", help="ClickHouse: chdb:///abs/dir or http(s)://host:8123 (default: settings)")
    p.add_argument("--database", help="ClickHouse database (default: settings)")
    p.add_argument("--no-wait", action="store_true", help="do not wait out forget.refresh_s")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    settings = get_settings()
    if args.expire:
        print(json.dumps(expire(settings, clickhouse=not args.no_clickhouse, dsn=args.dsn,
                                database=args.database), sort_keys=True))
        return 0
    if not args.subject:
        raise CliError("name a --subject (or --expire for retention)")
    summary = forget(settings, list(dict.fromkeys(args.subject)), requested_by=args.requested_by or getpass.getuser(),
                     reason=args.reason, gateway=args.gateway, clickhouse=not args.no_clickhouse, dsn=args.dsn,
                     database=args.database, wait=not args.no_wait)
    if not settings.forget.enabled:
        print("forget: note: forget.enabled is off in this process's settings: content written in the clear "
              "stays readable in topics and backups; only ClickHouse was blanked")
    print(json.dumps(summary, sort_keys=True))
    return 0
