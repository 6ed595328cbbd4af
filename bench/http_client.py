"""The benchmarks' HTTP client side: a minimal keep-alive HTTP/1.1 client (prebuilt requests, httptools
parsing; httpx costs several ms of CPU per call and would cap the client far below the servers), timed
calls, and conversations run from many concurrent workers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httptools


class _RawConnection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON and reads one response at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    async def post(self, path: str, body: bytes, headers: bytes = b"") -> tuple[int, bytes]:
        head = (f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n").encode() + headers + b"\r\n"
        self.writer.write(head + body)
        chunks: list[bytes] = []
        complete: list[bool] = []

        class Events:
            def on_body(self, data: bytes) -> None:
                chunks.append(data)

            def on_message_complete(self) -> None:
                complete.append(True)

        parser = httptools.HttpResponseParser(Events())
        while not complete:
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection")
            parser.feed_data(data)
        return parser.get_status_code(), b"".join(chunks)


class RawClient:
    """Pools of raw keep-alive connections per server. ``headers``: extra raw header lines (CRLF-ended)."""

    def __init__(self, headers: bytes = b"") -> None:
        self._idle: dict[str, list[_RawConnection]] = {}
        self._all: list[_RawConnection] = []
        self.headers = headers

    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        parts = urlsplit(url)
        idle = self._idle.setdefault(parts.netloc, [])
        # A kept connection the server closed while idle (servers time idle connections out) fails at
        # once: the request goes again on a new connection.
        while idle:
            conn = idle.pop()
            try:
                status, data = await conn.post(parts.path, body, self.headers)
            except ConnectionError:
                conn.writer.close()
                continue
            idle.append(conn)
            return status, data
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        conn = _RawConnection(reader, writer, parts.netloc)
        self._all.append(conn)
        status, data = await conn.post(parts.path, body, self.headers)
        idle.append(conn)
        return status, data

    async def close(self) -> None:
        for conn in self._all:
            conn.writer.close()


Poster = Callable[[str, bytes], Awaitable[tuple[int, bytes]]]


async def timed_call(post: Poster, url: str, body: bytes) -> float:
    """Seconds one call took; a non-200 answer raises."""
    began = time.perf_counter()
    status, data = await post(url, body)
    elapsed = time.perf_counter() - began
    if status != 200:
        raise RuntimeError(f"{url}: HTTP {status}: {data[:300]!r}")
    return elapsed


async def concurrently(post: Poster, conversations: list[list[tuple[str, bytes]]], workers: int,
                       on_done: Callable[[int], None] | None = None) -> tuple[list[float], float]:
    """Run every conversation (its calls in order, as one harness would) from ``workers`` concurrent
    workers; latencies of every call and wall seconds. ``on_done`` hears the count of calls done."""
    queue = list(reversed(conversations))
    latencies: list[float] = []

    async def worker() -> None:
        while queue:
            for url, body in queue.pop():
                latencies.append(await timed_call(post, url, body))
                if on_done is not None:
                    on_done(len(latencies))

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return latencies, time.perf_counter() - began


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
