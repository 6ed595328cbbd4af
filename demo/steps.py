"""The demos' shared steps: numbered progress lines, ``tokentrail`` subcommands run to completion, the common
bring-up (broker and topics, ClickHouse tables, the reference model), and a run's private settings."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tokentrail.settings import REPO_ROOT


def step(n: int, total: int, text: str) -> None:
    print(f"[{n}/{total}] {text}", flush=True)


def run_cli(*argv: str, quiet: bool = False) -> str:
    """Run a tokentrail subcommand (the same command a person would type, in this process's environment) to
    completion; ``quiet`` keeps its output (shown only when it fails) and returns it."""
    result = subprocess.run([sys.executable, "-m", "tokentrail.cli", *argv], cwd=REPO_ROOT, text=True,
                            capture_output=quiet)
    if result.returncode != 0:
        detail = f"\n{result.stdout}{result.stderr}" if quiet else ""
        raise RuntimeError(f"`tokentrail {' '.join(argv)}` failed with exit code {result.returncode}{detail}")
    return result.stdout or ""


def bring_up(total: int, broker: str) -> None:
    """Steps 1-3 of the main and production demos: ``broker`` names the Kafka broker in the first line."""
    step(1, total, f"{broker} and topics")
    run_cli("kafka", "start")
    run_cli("topics", "ensure")
    step(2, total, "ClickHouse tables (embedded chDB)")
    run_cli("clickhouse", "migrate")
    step(3, total, "reference model (built locally, cached)")
    run_cli("model", "build")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def private_env(state_dir: Path, model_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    """Settings overrides that give a run its own broker, ports, policy store and spool (under ``state_dir``), so
    it never touches (or stops) a broker someone else runs; ``extra``: the demo's own overrides."""
    return {
        "TOKENTRAIL_VAR_DIR": str(state_dir),
        "TOKENTRAIL_KAFKA__DATA_DIR": str(state_dir / "kafka"),
        "TOKENTRAIL_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "TOKENTRAIL_KAFKA__CONTROLLER_PORT": str(free_port()),
        "TOKENTRAIL_KAFKA__HEAP": "512m",
        "TOKENTRAIL_GATEWAY__PORT": str(free_port()),
        "TOKENTRAIL_TRAINER__CHECKPOINT_DIR": str(state_dir / "policies"),
        # The reference model build is deterministic and cached: share it.
        "TOKENTRAIL_MODEL__DIR": str(model_dir),
        **extra,
    }
