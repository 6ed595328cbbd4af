"""Whether the worker may act, and what stops it: shared by the agents, the timers and the watchdog.

Timers act only between rebalances, once table recovery is done (``ready``). An unexpected error (a
Kafka failure, a bug) stops the worker, which restarts from the committed offsets, instead of being
swallowed (``guarded``); bad input never gets there (it is dead-lettered).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import faust

log = logging.getLogger("tokentrail.processors")


class WorkerHealth:
    """The faust app's state as the worker's parts see it, and the error that stopped it (if any)."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.crashed: BaseException | None = None

    def ready(self) -> bool:
        """Timers act only between rebalances, once table recovery is done."""
        app = self.app
        return not (app.rebalancing or getattr(app, "in_recovery", False) or self.crashed)

    def guarded(self, fn: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        """Unexpected errors stop the worker (it restarts from committed offsets) instead of being
        swallowed; bad input never gets here (it is dead-lettered)."""

        @functools.wraps(fn)
        async def run(*args: Any) -> None:
            try:
                await fn(*args)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("processors worker failed; stopping so it restarts from committed offsets")
                self.crashed = exc
                await self.app.crash(exc)
                raise

        return run
