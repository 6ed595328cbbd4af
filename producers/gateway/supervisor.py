"""Run N gateway worker processes and keep them running: ``tokentrail gateway --processes N``.

The supervisor serves nothing itself. It starts each worker as a process of its own (the command it is
given, one per worker index), restarts a worker that exits while the gateway runs (after a pause that
doubles while a worker keeps dying young, so a worker that cannot start does not spin), and on SIGTERM or
SIGINT asks every worker to stop (SIGTERM: each drains its calls in flight and closes its Kafka producer),
waits, and kills what is left after the grace period. A worker that keeps failing before it has run
``min_uptime_s`` (a port taken, bad settings) ends the whole gateway with an error instead of looping.
Workers die with the supervisor (Linux ``PR_SET_PDEATHSIG``), so a killed supervisor leaves no orphans
holding the port.

Why processes and not threads or fork: each worker needs its own event loop, tokenizer, Kafka producer and
spool, all of which must be made after the split, and a worker that crashes must not take the others down.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType

PR_SET_PDEATHSIG = 1


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None  # when a dead worker is started again
    quick_failures: int = 0  # deaths in a row before min_uptime_s
    restarts: int = 0


@dataclass
class Supervisor:
    """Keeps ``processes`` workers (``command(index)``) running until SIGTERM/SIGINT (see the module)."""

    command: Callable[[int], list[str]]
    processes: int
    log: Callable[[str], None] = print
    env: Mapping[str, str] | None = None
    stop_grace_s: float = 45.0
    min_uptime_s: float = 10.0
    max_quick_failures: int = 5
    first_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    poll_s: float = 0.2
    _workers: list[_Worker] = field(default_factory=list)
    _stopping: bool = False

    def run(self) -> int:
        """Start the workers and supervise them; returns 0 after a requested stop, 1 after giving up."""
        previous = {sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        self._workers = [_Worker(index) for index in range(self.processes)]
        failed = False
        try:
            for worker in self._workers:
                self._start(worker)
            while not self._stopping:
                failed = self._tend()
                if failed:
                    break
                time.sleep(self.poll_s)
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 1 if failed else 0

    def _request_stop(self, signum: int, _frame: FrameType | None) -> None:
        self._stopping = True

    def _start(self, worker: _Worker) -> None:
        # A group of its own: a terminal's Ctrl-C reaches the supervisor only, which asks each worker once
        # (uvicorn takes a second signal as "exit now", skipping the drain of calls in flight).
        worker.proc = subprocess.Popen(self.command(worker.index), env=None if self.env is None else dict(self.env),
                                       preexec_fn=_die_with_parent, process_group=0)
        worker.started_at, worker.restart_at = time.monotonic(), None
        self.log(f"worker {worker.index} started (pid {worker.proc.pid})")

    def _tend(self) -> bool:
        """Restart dead workers when their pause is over; True when one failed too often to go on."""
        now = time.monotonic()
        for worker in self._workers:
            proc = worker.proc
            if worker.restart_at is not None:
                if now >= worker.restart_at:
                    worker.restarts += 1
                    self._start(worker)
                continue
            if proc is None or proc.poll() is None:
                continue
            lived = now - worker.started_at
            worker.quick_failures = worker.quick_failures + 1 if lived < self.min_uptime_s else 0
            if worker.quick_failures >= self.max_quick_failures:
                self.log(f"worker {worker.index} exited {_how(proc.returncode)} {worker.quick_failures} times in a "
                         f"row within {self.min_uptime_s:g}s of starting; stopping the gateway")
                return True
            pause = min(self.max_backoff_s, self.first_backoff_s * 2 ** max(0, worker.quick_failures - 1))
            worker.restart_at = now + pause
            self.log(f"worker {worker.index} (pid {proc.pid}) exited {_how(proc.returncode)} after {lived:.1f}s; "
                     f"restarting it in {pause:g}s")
        return False

    def _stop_all(self) -> None:
        alive = [w.proc for w in self._workers if w.proc is not None and w.proc.poll() is None]
        if alive:
            self.log(f"stopping {len(alive)} worker(s)")
        for proc in alive:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        for proc in alive:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log(f"worker pid {proc.pid} did not stop within {self.stop_grace_s:g}s; killing it")
                proc.kill()
                proc.wait()
        self.log("all workers stopped")


def _how(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"on signal {signal.Signals(-returncode).name}"
    return f"with code {returncode}"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the supervisor dies (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
