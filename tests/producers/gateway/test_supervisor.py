"""The gateway's supervisor (supervisor.py) with real child processes: a worker that keeps dying young is
restarted with growing pauses and then ends the gateway with an error, instead of spinning; the kill -9 of
a running worker and the stop on SIGTERM are in test_gateway_processes.py."""

from __future__ import annotations

import sys

from producers.gateway.supervisor import Supervisor


def test_a_worker_that_keeps_failing_at_start_is_restarted_then_given_up_on() -> None:
    lines: list[str] = []
    starts: list[int] = []

    def command(index: int) -> list[str]:
        starts.append(index)
        # Worker 0 fails at once (a port taken, bad settings); worker 1 runs until it is stopped.
        return [sys.executable, "-c", "import sys; sys.exit(3)" if index == 0 else "import time; time.sleep(60)"]

    supervisor = Supervisor(command, 2, log=lines.append, max_quick_failures=3, first_backoff_s=0.01,
                            poll_s=0.02, stop_grace_s=10)
    assert supervisor.run() == 1
    assert starts.count(0) == 3 and starts.count(1) == 1  # restarted twice, then given up on
    assert sum("worker 0" in line and "exited with code 3" in line and "restarting it in" in line
               for line in lines) == 2
    assert "3 times in a row" in lines[-3]
    assert lines[-2:] == ["stopping 1 worker(s)", "all workers stopped"]  # the healthy one is stopped too
