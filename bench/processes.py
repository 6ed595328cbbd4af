"""Servers the benchmarks start as processes of their own, and what /proc says about them."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from tokentrail.runtime.process import descendants


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])




SCHEDSTAT = Path("/proc/self/schedstat").exists()


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and its descendants (all live threads), from /proc.

    Per-thread scheduler time (``task/*/schedstat``, nanoseconds) where the kernel keeps it: the clock-tick
    counters of ``stat`` move in 10 ms steps, so a few ~1 ms calls read 0 there (issue 29). Without
    schedstat, ``stat``'s ticks. One source for every reading, so differences compare like with like."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for p in [pid, *descendants(pid)]:
        if SCHEDSTAT:
            total += _thread_ns(p) / 1e9
            continue
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _thread_ns(pid: int) -> int:
    """Nanoseconds on the CPU of every live thread of ``pid`` (0 without schedstat)."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its descendants, MiB."""
    total_kib = 0
    for p in [pid, *descendants(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
    return total_kib / 1024


async def wait_healthy(client: httpx.AsyncClient, url: str, proc: subprocess.Popen[bytes], what: str,
                       timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the {what} server exited ({proc.returncode})")
        try:
            if (await client.get(url)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the {what} server did not become healthy")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
