"""The ``tokentrail`` command. Each area registers its own subcommands; this module only wires them.

A module listed in COMMAND_MODULES exposes ``register(subparsers)``, which adds its subcommands and
sets ``func`` (taking the parsed args, returning an exit code) on each.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES: list[str] = [
    "tokentrail.kafka_local",
    "tokentrail.topics_cli",
    "schemas.fixtures",
    "tokentrail.demo.run",
    "sinks.cli",
    "trainer_consumer.cli",
    "processors.worker",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokentrail",
        description="Token-exact data plane for online agentic RL. See README.md.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except CliError as exc:
        print(f"tokentrail {args.command}: {exc}", file=sys.stderr)
        return 2


class CliError(Exception):
    """An error a person can act on; printed without a traceback."""


if __name__ == "__main__":
    sys.exit(main())
