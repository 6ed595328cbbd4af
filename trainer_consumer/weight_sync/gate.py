"""A gate between calls and weight updates, for a router that shares a process with the syncer.

Calls take a lease (``async with gate.lease() as version``) and record the version they got; an
update closes the gate, which holds new calls and waits until the running ones have finished, then
reopens it at the new version. No call's tokens can then span an update, and each call's version is
the one its tokens were sampled with, whatever the engine reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class VersionGate:
    def __init__(self, version: int, *, is_open: bool = True) -> None:
        """``is_open=False``: calls wait until the first ``reopen`` says which version serves them."""
        self.version = version
        self._open = is_open
        self._running = 0
        self._held = 0  # calls waiting at the closed gate
        self._changed = asyncio.Condition()

    @property
    def running(self) -> int:
        return self._running

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def held(self) -> int:
        """Calls waiting for the gate to open (what an update holds back, for health and tests)."""
        return self._held

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[int]:
        async with self._changed:
            self._held += 1
            try:
                await self._changed.wait_for(lambda: self._open)
            finally:
                self._held -= 1
            self._running += 1
            version = self.version
        try:
            yield version
        finally:
            async with self._changed:
                self._running -= 1
                self._changed.notify_all()

    async def close(self) -> None:
        """Hold new calls and return once no call is running."""
        async with self._changed:
            self._open = False
            await self._changed.wait_for(lambda: self._running == 0)

    async def hold(self) -> None:
        """Hold new calls but let the running ones go on (an in-flight update, pause mode ``keep``: the
        engine freezes them across the update and each token's version comes from the engine's spans)."""
        async with self._changed:
            self._open = False

    async def reopen(self, version: int) -> None:
        async with self._changed:
            self.version, self._open = version, True
            self._changed.notify_all()
