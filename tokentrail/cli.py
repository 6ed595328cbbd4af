"""The ``tokentrail`` command. Each area registers its own subcommands; this module only wires them.

A module in COMMANDS exposes ``register(subparsers)``, which adds its subcommands and sets ``func``
(taking the parsed args, returning an exit code) on each. Only the module that owns the command
being run is imported, so ``tokentrail kafka status`` does not pay for torch or transformers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from tokentrail.errors import CliError

FORGET_ENABLED_VAR = "TOKENTRAIL_FORGET__ENABLED"

# command -> (module that registers it, one-line help for the top-level listing)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo.run", "the main job: online RL end to end on the embedded defaults"),
    "kafka": ("tokentrail.kafka_local", "the local Apache Kafka broker: start | stop | status"),
    "topics": ("tokentrail.topics_cli", "create or check every topic: ensure | list"),
    "model": ("tokentrail.commands.model", "the embedded reference model: build | info"),
    "gateway": ("tokentrail.commands.gateway", "run the gateway (OpenAI + Anthropic HTTP) on an upstream"),
    "process": ("tokentrail.commands.process", "run a stream-processor worker (faust)"),
    "clickhouse": ("tokentrail.commands.sinks", "ClickHouse schema: migrate | ddl | readonly-user | counts"),
    "sink": ("tokentrail.commands.sinks", "consume every topic into ClickHouse"),
    "audit": ("tokentrail.commands.sinks", "the four audit checks; exit 1 when any fails"),
    "forget": ("tokentrail.commands.forget", "forget a subject: destroy its keys, blank its content"),
    "scan-residue": ("tokentrail.commands.residue",
                     "find readable content of forgotten subjects in topics, spool, ClickHouse and reports"),
    "trace": ("tokentrail.commands.sinks", "trace one sample (and token) back to its call, prompt, rollout and scores"),
    "replay": ("tokentrail.commands.sinks", "re-derive rewards, credit and samples under a new configuration"),
    "report": ("tokentrail.commands.sinks", "self-contained HTML report with plots"),
    "train": ("tokentrail.commands.train", "run the trainer on the samples topic"),
    "schemas": ("tokentrail.commands.schemas", "the Avro contract: fixtures for compatibility tests"),
    "reliability": ("reliability.cli", "fault and bad-input suite; prints what was lost or duplicated"),
    "release": ("tokentrail.commands.release", "safe policy release: status | start | promote | rollback | pin"),
    "weight-sync": ("tokentrail.commands.weight_sync", "keep vLLM servers on the trainer's latest published policy"),
    "harnesses": ("tokentrail.commands.harnesses", "real agent harnesses through the gateway: check"),
    "conformance": ("tokentrail.commands.conformance", "harnesses x model families, judged by renderers and vLLM"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command``, only that command's module is imported and registered."""
    parser = argparse.ArgumentParser(
        prog="tokentrail",
        description="Token-exact data plane for online agentic RL. See README.md.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = [COMMANDS[command][0]] if command in COMMANDS else list(dict.fromkeys(m for m, _ in COMMANDS.values()))
    if command in COMMANDS:
        for name, (_module, help_text) in COMMANDS.items():
            if _module != modules[0]:
                sub.add_parser(name, help=help_text)
    for module in modules:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None:  # top-level help: list commands without importing any of them
        parser = argparse.ArgumentParser(prog="tokentrail", description="Token-exact data plane for online "
                                         "agentic RL. See README.md.")
        sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        for name, (_module, help_text) in COMMANDS.items():
            sub.add_parser(name, help=help_text)
        parser.parse_args(argv)
        parser.print_help()
        return 2
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.parse_args([*argv, "--help"])
        return 2
    try:
        if os.environ.get(FORGET_ENABLED_VAR, "true").strip().lower() not in ("0", "false", "no", "off"):
            # Seal and open subjects' content in this command (docs/forgetting.md; on unless turned off).
            # Read from the environment, the settings' only override, so a command run with forgetting off
            # does not import the settings for it. Installing does no I/O: the key store connects on first use.
            from tokentrail.forgetting import install_from_settings

            install_from_settings()
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except CliError as exc:
        print(f"tokentrail {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
