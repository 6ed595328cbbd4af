"""Run stream-processor workers as child processes: the environment that gives a child exactly these settings,
and start / stop of ``python -m tokentrail.commands.process`` (the demo, reliability, benchmarks and tests use
them); also the worker's static member id.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tokentrail.settings import REPO_ROOT, Settings, get_settings

__all__ = ["instance_id", "settings_env", "start_worker_process", "stop_worker_process", "worker_command"]

SETTINGS_SECTIONS = ("kafka", "clickhouse", "model", "gateway", "processors", "trainer")
# What worker_command runs: the ``tokentrail process`` command's module, as ``python -m``.
WORKER_MODULE = "tokentrail.commands.process"


def instance_id(given: str | None, settings: Settings) -> str | None:
    """The worker's static member id: the flag, else the setting; "{hostname}" filled in."""
    value = given if given is not None else settings.processors.instance_id
    return value.replace("{hostname}", socket.gethostname()) if value else None



def settings_env(settings: Settings, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment that makes a child process see exactly ``settings``: every section as JSON,
    and no other TOKENTRAIL_* variable that could override it."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("TOKENTRAIL_")}
    for section in SETTINGS_SECTIONS:
        env[f"TOKENTRAIL_{section.upper()}"] = getattr(settings, section).model_dump_json()
    env["TOKENTRAIL_VAR_DIR"] = str(settings.var_dir)
    return env


def worker_command(topic_prefix: str = "", loglevel: str = "info", extra_args: Sequence[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", WORKER_MODULE, "--loglevel", loglevel]
    if topic_prefix:
        cmd += ["--topic-prefix", topic_prefix]
    return cmd + list(extra_args)


def start_worker_process(settings: Settings | None = None, *, topic_prefix: str = "", loglevel: str = "info",
                         log_path: Path | None = None, extra_args: Sequence[str] = ()) -> subprocess.Popen:
    """Start ``python -m tokentrail.commands.process`` with these settings; its output goes to
    ``log_path`` (appended) or to this process's stderr. Stop it with ``stop_worker_process``."""
    settings = settings or get_settings()
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    out = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115 - owned by the child
    try:
        return subprocess.Popen(worker_command(topic_prefix, loglevel, extra_args), cwd=REPO_ROOT,
                                env=settings_env(settings), stdin=subprocess.DEVNULL,
                                stdout=out if out is not None else sys.stderr, stderr=subprocess.STDOUT)
    finally:
        if out is not None:
            out.close()


def stop_worker_process(proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM (faust stops gracefully and commits), SIGKILL after ``timeout_s``; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, their children, ...), read from /proc; ``root`` not included."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # the process ended while we read
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
