"""Start, kill and read back the sink child process (tokentrail.reliability.sink_child)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tokentrail.commands.process import settings_env
from tokentrail.settings import REPO_ROOT, Settings


def start_sink(settings: Settings, prefix: str, dsn: str, group: str, log_path: Path, *,
               idle_s: float = 4.0, batch_rows: int = 200) -> subprocess.Popen:
    out = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "tokentrail.reliability.sink_child", "run", "--prefix", prefix, "--dsn", dsn,
             "--group", group, "--idle-s", str(idle_s), "--batch-rows", str(batch_rows)],
            cwd=REPO_ROOT, env=settings_env(settings), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT)
    finally:
        out.close()


def run_sink_until_idle(settings: Settings, prefix: str, dsn: str, group: str, log_path: Path, *,
                        idle_s: float = 4.0, timeout_s: float = 180.0) -> int:
    proc = start_sink(settings, prefix, dsn, group, log_path, idle_s=idle_s)
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the sink did not go idle within {timeout_s:g}s; see {log_path}") from None
    if code != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"the sink exited with {code}:\n" + "\n".join(tail))
    return code


def query_sink(settings: Settings, dsn: str, timeout_s: float = 120.0) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tokentrail.reliability.sink_child", "query", "--dsn", dsn],
                          cwd=REPO_ROOT, env=settings_env(settings), capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sink query failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
