"""Start a gateway process while a broker (or cluster) boots, so the model load and the JVM start overlap.

The gateway must not need Kafka to start: its settings turn recovery off (``recover_on_start``), since
the topics appear only once the broker is up; nothing may be driven through it before this returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from reliability.faults import GatewayProcess


def start_gateway_beside(gateway: GatewayProcess, start_other: Callable[[], None], timeout_s: float = 300.0) -> None:
    """Run ``gateway.start`` in a thread while ``start_other()`` runs here; raise the first failure."""
    failures: list[BaseException] = []

    def start() -> None:
        try:
            gateway.start(timeout_s)
        except BaseException as exc:  # re-raised below, in the caller's thread
            failures.append(exc)

    thread = threading.Thread(target=start, name="gateway-start", daemon=True)
    thread.start()
    try:
        start_other()
    finally:
        thread.join(timeout_s + 30)
    if failures:
        raise failures[0]
    if thread.is_alive():
        raise RuntimeError(f"the gateway did not start within {timeout_s:g}s; see {gateway.log_path}")
