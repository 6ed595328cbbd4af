"""A token stream whose inner stream is opened at its first item, and whose hold on a shared resource (a gate's
lease, a server's slot) ends when the stream ends, fails or is closed.

Three upstream wrappers have this shape (the weight gate's leased stream, the versioned fleet's server stream,
the release router's routed stream): opening may wait (for an update, a load, a routing plan), so it happens
when the caller first asks for an item, not when the stream object is made; a ``prefer_whole`` said before the
open still reaches the inner stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from producers.upstreams.base import GenerateResult, TokenChunk

Item = TokenChunk | GenerateResult


class DeferredStream:
    """Subclasses give ``_open`` (take what the stream holds; return the inner stream, or None when it was given
    to the constructor), and may give ``_settle`` (look at or change each item) and ``_release`` (let go of what
    ``_open`` took; called once per open at the stream's end, on an error, or on ``aclose``)."""

    def __init__(self, items: AsyncIterator[Item] | None = None) -> None:
        self._items: Any = items  # the inner stream: given now, or made by _open at the first item
        self._opened = False
        self._prefer_whole = False

    def prefer_whole(self) -> None:
        self._prefer_whole = True
        if self._items is not None:
            _prefer_whole(self._items)

    def __aiter__(self) -> DeferredStream:
        return self

    async def __anext__(self) -> Item:
        if not self._opened:
            made = await self._open()  # may wait; a failed open is tried again on the next item
            if made is not None:
                self._items = made
                if self._prefer_whole:
                    _prefer_whole(made)
            self._opened = True
        try:
            item: Item = await self._items.__anext__()
        except BaseException:
            await self._release()
            raise
        return await self._settle(item)

    async def aclose(self) -> None:
        try:
            close = getattr(self._items, "aclose", None)
            if close is not None:
                await close()
        finally:
            await self._release()

    async def _open(self) -> AsyncIterator[Item] | None:
        raise NotImplementedError

    async def _settle(self, item: Item) -> Item:
        return item

    async def _release(self) -> None:
        return None


def _prefer_whole(items: Any) -> None:
    """A client that does not stream costs one whole upstream answer, where the inner stream can give one."""
    prefer = getattr(items, "prefer_whole", None)
    if prefer is not None:
        prefer()
