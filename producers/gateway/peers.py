"""Several gateway processes behind one port, each request served by the process that owns its rollout.

Every process listens on the shared port (``SO_REUSEPORT``: the kernel spreads connections over them) and
on a port of its own for its peers. ``StickyRouter`` wraps each process's app: a request that names a
rollout another process owns (sticky.py) is passed to that process over a kept connection, bytes in and
bytes out (streamed answers as they come); everything else is served here. A rollout started without an
id gets one this process owns, so with N processes about (N-1)/N of a rollout's requests take one local
hop. What each process keeps is its own: its attempt registry, caches, Kafka producer and spool (a spool
directory per process).

Limits: a call named only by its attempt's API key (no path prefix, no X-Rollout-Id) is served where it
lands, which knows the key only if it started the attempt, so such harnesses need one process (or a
front that routes by key); organic sessions (sessions.py) likewise key their rollouts by what the
request body says and are not routed.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from producers.gateway.sticky import FORWARDED_HEADER, START_PATH, mint_owned_rollout_id, owner_of, rollout_of
from producers.upstreams.http1 import Http1Pool, TransportError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# Set per connection or by the sending server; never relayed.
_HOP_BY_HOP = frozenset({b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding",
                         b"date", b"server", b"upgrade", b"te", b"trailer"})


class StickyRouter:
    """ASGI middleware: serve here what this process owns, pass the rest to the owner (see the module)."""

    def __init__(self, app: App, process: int, peer_urls: list[str]) -> None:
        self.app, self.process, self.peer_urls = app, process, peer_urls
        self.processes = len(peer_urls)
        self.pool = Http1Pool(timeout_s=900.0)
        self.forwarded = 0  # requests passed to another process (a metric for the benchmark)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.processes == 1:
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        if any(name == FORWARDED_HEADER for name, _ in headers):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == START_PATH and scope["method"] == "POST":
            await self._start(scope, receive, send)
            return
        rollout_id = rollout_of(path, headers)
        owner = self.process if rollout_id is None else owner_of(rollout_id, self.processes)
        if owner == self.process:
            await self.app(scope, receive, send)
            return
        await self._forward(owner, scope, await _read_body(receive), send)

    async def _start(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A rollout's start: by its given id's owner, else here under an id this process owns."""
        body = await _read_body(receive)
        try:
            start = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            start = None  # malformed: the app says so
        if isinstance(start, dict):
            given = start.get("rollout_id")
            if isinstance(given, str) and given:
                owner = owner_of(given, self.processes)
                if owner != self.process:
                    await self._forward(owner, scope, body, send)
                    return
            elif given is None:
                start["rollout_id"] = mint_owned_rollout_id(self.process, self.processes)
                body = orjson.dumps(start)
        await self.app(scope, _replay(body, receive), send)

    async def _forward(self, owner: int, scope: Scope, body: bytes, send: Send) -> None:
        self.forwarded += 1
        target = self.peer_urls[owner] + scope["path"]
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]
        headers.append((FORWARDED_HEADER, b"1"))
        try:
            response = await self.pool.request(scope["method"], target, body, headers)
        except TransportError as exc:
            message = orjson.dumps({"error": {"message": f"the gateway process that owns this rollout did not "
                                              f"answer: {exc}", "type": "unavailable", "code": "peer_unavailable"}})
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": message})
            return
        try:
            kept = [(k, v) for k, v in response.headers if k.lower() not in _HOP_BY_HOP]
            await send({"type": "http.response.start", "status": response.status_code, "headers": kept})
            async for chunk in response.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            response.release()


async def _read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


def _replay(body: bytes, then: Receive) -> Receive:
    """A receive callable that yields ``body`` once, then what the server's ``then`` says (a disconnect)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await then()

    return receive


def shared_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` that other processes may bind too (``SO_REUSEPORT``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
