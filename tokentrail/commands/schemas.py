"""``tokentrail schemas fixtures``: write encoded fixtures for new schema versions (``schemas.fixtures``)."""

from __future__ import annotations

import argparse

from schemas.fixtures import write_missing_fixtures


def _run(_args: argparse.Namespace) -> int:
    written = write_missing_fixtures()
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} new fixture(s); commit them with the schema change")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    schemas = sub.add_parser("schemas", help="the Avro contract: fixtures for compatibility tests")
    schemas_sub = schemas.add_subparsers(dest="schemas_command", metavar="ACTION")
    fixtures = schemas_sub.add_parser("fixtures", help="write encoded fixtures for new schema versions")
    fixtures.set_defaults(func=_run)
