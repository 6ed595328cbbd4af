"""Start and stop the demo's long-running services as child processes, each with its own log file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tokentrail.settings import REPO_ROOT, VAR_DIR


@dataclass
class Service:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tokentrail.cli", *self.argv], cwd=REPO_ROOT, stdout=log,
            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait, then SIGKILL: every service shuts down cleanly on SIGTERM."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def wait(self, timeout_s: float) -> int | None:
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, service: Service | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service is not None and not service.alive():
            raise RuntimeError(f"{service.name} exited while waiting for {what}:\n{service.tail()}")
        if check():
            return
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}"
                       + (f"\n{service.tail()}" if service else ""))


def http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return httpx.get(url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    return check


def log_dir() -> Path:
    return VAR_DIR / "logs"
