"""A release-routed call keeps the whole-answer path: a client that does not stream costs one whole
upstream answer, not a stream of per-token events, also when the release decides its version."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from producers.gateway.release_routed import _RoutedStream
from producers.upstreams.base import WholeOrStreamed


def _run(prefer_whole: bool) -> tuple[list[str], list[object]]:
    made: list[str] = []

    def upstream(request: object) -> WholeOrStreamed:
        async def streamed() -> AsyncIterator[object]:
            made.append(f"streamed {request}")
            yield "token"
            yield "result"

        async def whole() -> object:
            made.append(f"whole {request}")
            return "result"

        return WholeOrStreamed(streamed, whole)

    async def route() -> str:
        await asyncio.sleep(0)  # routing may wait for the release plan
        return "routed-request"

    async def consume() -> list[object]:
        stream = _RoutedStream(route, upstream)
        if prefer_whole:
            stream.prefer_whole()
        items = [item async for item in stream]
        await stream.aclose()
        return items

    return made, asyncio.run(consume())


def test_prefer_whole_reaches_the_routed_upstream_request() -> None:
    made, items = _run(prefer_whole=True)
    assert made == ["whole routed-request"] and items == ["result"]


def test_without_it_the_routed_request_streams() -> None:
    made, items = _run(prefer_whole=False)
    assert made == ["streamed routed-request"] and items == ["token", "result"]
