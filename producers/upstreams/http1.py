"""A lean HTTP/1.1 client for talking to model servers: keep-alive connections per server, requests
written in one piece, responses parsed by httptools (llhttp) as they arrive, bodies read whole or
chunk by chunk.

Why not httpx: on the gateway's hot path httpx and httpcore cost milliseconds of CPU per call (layers of
request/response models, anyio streams, per-line decoding), several times what the gateway's own work
costs. This client does only what a model server needs: POST/GET with a bytes body to plain-HTTP
servers, content-length or chunked answers, connection reuse, deadlines.

Errors: ``ConnectFailed`` (the server was never reached: safe to try another), ``Timeout`` (the
deadline passed), ``TransportError`` (the connection broke mid-request). A connection whose answer was
not read to its end is closed, never reused.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlsplit

import httptools


class TransportError(Exception):
    """The connection failed or broke during a request."""


class ConnectFailed(TransportError):
    """The server could not be reached; nothing was sent."""


class Timeout(TransportError):
    """The request's deadline passed."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; it carries one request/response at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = True
        self.received_any = False
        self.body: deque[bytes] = deque()
        self.headers: list[tuple[bytes, bytes]] = []

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = TransportError(f"unreadable HTTP response: {exc}")
            self.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self.error is None:
            self.error = TransportError(f"the server closed the connection{f' ({exc})' if exc else ''}")
        self._wake()

    # -- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()

    # -- the client side

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        """Until more has arrived (or the connection failed); raises what broke it."""
        if self.error is not None:
            raise self.error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.error is not None and not self.complete and not self.body:
            raise self.error

    def send(self, data: bytes) -> None:
        self._reset()
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Response:
    """An answer whose status is known; its body is read with ``read`` or ``chunks``, then ``release``."""

    def __init__(self, pool: Http1Pool, key: str, conn: _Connection, deadline: asyncio.TimerHandle) -> None:
        self._pool, self._key, self._conn, self._deadline = pool, key, conn, deadline
        self.status_code = conn.status
        self.headers = conn.headers  # (name, value) as received
        self._released = False

    async def read(self) -> bytes:
        conn = self._conn
        try:
            while not conn.complete:
                await conn.wait()
            return b"".join(conn.body)
        finally:
            self.release()

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (HTTP chunking already undone)."""
        conn = self._conn
        while True:
            while conn.body:
                yield conn.body.popleft()
            if conn.complete:
                return
            await conn.wait()

    async def drain(self, timeout_s: float) -> None:
        """Read what is left of the body (a stream's end after its last event) within ``timeout_s``, so
        the connection can be kept; past it, or on a failure, ``release`` closes the connection."""
        conn = self._conn

        async def to_end() -> None:
            while not conn.complete:
                conn.body.clear()
                await conn.wait()

        try:
            await asyncio.wait_for(to_end(), timeout_s)
        except (TimeoutError, TransportError):
            pass

    def release(self) -> None:
        """Give the connection back (when its answer was read to the end) or close it."""
        if self._released:
            return
        self._released = True
        self._deadline.cancel()
        conn = self._conn
        conn.body = deque()
        if conn.complete and conn.keep_alive and not conn.closed:
            self._pool._idle.setdefault(self._key, []).append(conn)
        else:
            conn.close()


class Http1Pool:
    """Keep-alive connections to any number of ``http://host:port`` servers."""

    def __init__(self, headers: dict[str, str] | None = None, timeout_s: float = 600.0,
                 connect_timeout_s: float = 5.0) -> None:
        self._idle: dict[str, list[_Connection]] = {}
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s

    async def request(self, method: str, url: str, body: bytes = b"",
                      headers: Sequence[tuple[bytes, bytes]] = (), host: bytes | None = None) -> Response:
        """Send a request; returns once the answer's status and headers are in (its body may not be).
        ``headers``: more header lines for this request (not host or content-length, which are set here);
        ``host``: the Host line, when it is not the server's address (a proxy passing on its client's)."""
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ConnectFailed(f"only plain http:// servers are supported, not {url!r}")
        key = parts.netloc
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        head = (f"{method} {path} HTTP/1.1\r\nhost: ".encode() + (host or key.encode()) +
                f"\r\n{self._headers}content-length: {len(body)}\r\n".encode())
        if headers:
            head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        head += b"\r\n"
        loop = asyncio.get_running_loop()
        # A kept connection the server closed just before our request can fail without an answer; the
        # request then goes once more on a new connection (the server never read it).
        for reused in (True, False):
            conn = self._take(key) if reused else await self._connect(parts.hostname, parts.port or 80)
            if conn is None:
                continue
            deadline = loop.call_later(self.timeout_s, _expire, conn)
            conn.send(head + body)
            try:
                while not conn.headers_done:
                    await conn.wait()
            except TransportError as exc:
                deadline.cancel()
                conn.close()
                if isinstance(exc, Timeout):
                    raise Timeout(f"no answer from {key} within {self.timeout_s:g} s") from None
                if reused and not conn.received_any:
                    continue
                raise
            return Response(self, key, conn, deadline)
        raise AssertionError("unreachable")

    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        response = await self.request("POST", url, body)
        return response.status_code, await response.read()

    async def get(self, url: str) -> tuple[int, bytes]:
        response = await self.request("GET", url)
        return response.status_code, await response.read()

    def _take(self, key: str) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _connect(self, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(_Connection, host, port),
                                             self.connect_timeout_s)
        except (TimeoutError, OSError) as exc:
            raise ConnectFailed(f"cannot connect to {host}:{port}: {exc!r}") from exc
        return conn

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _expire(conn: _Connection) -> None:
    conn.error = Timeout("the request's deadline passed")
    conn.close()
    conn._wake()
