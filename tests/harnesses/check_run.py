"""One ``tokentrail harnesses check`` run shared by the harness tests (the ``harnesses_check`` session fixture):
every harness that runs through the gateway does its scripted task once, on topics of its own, and each test
reads what it needs from that run (its table, its last-line JSON, or a harness's records on the topics)
instead of running the harness again. The check runs as the command users run, in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokentrail.commands.harnesses import _records
from tokentrail.settings import Settings

# A failure bound only: each harness run has the check's own --timeout-s inside it.
CHECK_TIMEOUT_S = 3600


@dataclass
class CheckRun:
    exit_code: int
    lines: list[str]
    summary: dict[str, Any]
    topics: dict[str, str]
    settings: Settings
    log: str  # everything the check printed, stdout then stderr

    def row(self, harness: str) -> dict[str, Any]:
        return dict(self.summary["per_harness"][harness])

    def records(self, harness: str) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
        """(the harness's call records by call index, its env records) from the run's topics."""
        row = self.row(harness)
        calls = [r for _, r in _records(self.settings, self.topics["calls_topic"], row["rollout_id"], row["calls"],
                                        "CallRecord")]
        env = _records(self.settings, self.topics["env_topic"], row["rollout_id"], 2)
        return sorted(calls, key=lambda r: r["call_index"]), env


def run_check(settings: Settings, topics: dict[str, str], *args: str) -> CheckRun:
    command = [str(Path(sys.executable).parent / "tokentrail"), "harnesses", "check",
               "--calls-topic", topics["calls_topic"], "--env-topic", topics["env_topic"], *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    log = f"$ {' '.join(command)}\n{done.stdout}\n--- stderr\n{done.stderr[-6000:]}"
    lines = done.stdout.strip().splitlines()
    try:
        summary = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise AssertionError(f"the check printed no summary (exit {done.returncode}):\n{log}") from None
    return CheckRun(done.returncode, lines, summary, topics, settings, log)
