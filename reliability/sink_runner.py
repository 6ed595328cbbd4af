"""Start, kill and read back the sink child process (reliability.sink_child)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tokentrail.runtime.process import settings_env
from tokentrail.settings import REPO_ROOT, Settings


def start_sink(settings: Settings, prefix: str, dsn: str, group: str, log_path: Path, *,
               idle_s: float = 4.0, batch_rows: int = 200) -> subprocess.Popen:
    out = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "reliability.sink_child", "run", "--prefix", prefix, "--dsn", dsn,
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


def run_sink_until_caught_up(settings: Settings, prefix: str, dsn: str, group: str, log_path: Path, *,
                             timeout_s: float = 180.0, max_runs: int = 3) -> int:
    """Run the sink until its group has committed every record of every topic it reads (lag 0), then stop
    it; returns how many runs that took.

    "Caught up" is read from the broker (committed offsets against the end of each partition), not
    inferred from a quiet spell: a sink restarted after a kill -9 can go quiet while part of its topics
    are still assigned to the dead member it replaced, and an idle stop then would end the run with
    records unread (they are not lost: the next run stores them, as a long-running sink does). A run
    that exits before that is started again, as a supervisor would, up to ``max_runs``."""
    from confluent_kafka import Consumer, TopicPartition

    from reliability.sink_child import topic_map
    from schemas.kafka.config import consumer_config

    topics, dead_letters = topic_map(prefix)
    probe = Consumer(consumer_config(settings.kafka, group))  # never subscribes: reads the group's commits only
    try:
        metadata = probe.list_topics(timeout=30).topics
        partitions = [TopicPartition(t, p) for t in [*topics, dead_letters] if t in metadata
                      for p in metadata[t].partitions]
        deadline = time.monotonic() + timeout_s
        for run in range(1, max_runs + 1):
            proc = start_sink(settings, prefix, dsn, group, log_path, idle_s=timeout_s)
            try:
                while proc.poll() is None:
                    if _lag(probe, partitions) == 0:
                        return run
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the sink did not catch up within {timeout_s:g}s; see {log_path}")
                    time.sleep(0.5)
                if proc.returncode != 0:
                    tail = log_path.read_text(errors="replace").splitlines()[-15:]
                    raise RuntimeError(f"the sink exited with {proc.returncode}:\n" + "\n".join(tail))
                if _lag(probe, partitions) == 0:
                    return run
            finally:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        raise RuntimeError(f"the sink stopped {max_runs} times before catching up; see {log_path}")
    finally:
        probe.close()


def _lag(probe: Any, partitions: list[Any]) -> int:
    """Records of ``partitions`` the probe's group has not committed yet."""
    lag = 0
    for tp in probe.committed(partitions, timeout=30):
        low, high = probe.get_watermark_offsets(tp, timeout=30)
        done = tp.offset if tp.offset >= 0 else low
        lag += max(0, high - done)
    return lag


def query_sink(settings: Settings, dsn: str, timeout_s: float = 120.0) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "reliability.sink_child", "query", "--dsn", dsn],
                          cwd=REPO_ROOT, env=settings_env(settings), capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sink query failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
