"""Several gateway processes behind one port, each request served by the process that owns its session.

Every process listens on the shared port (``SO_REUSEPORT``: the kernel spreads connections over them) and
on a loopback port of its own for its peers. ``StickyRouter`` wraps each process's app: a request whose
session (sticky.py: its rollout, minted key, organic session key or harness session header) another process
owns is passed to that process over a kept connection, bytes in and bytes out (streamed answers as they
come); everything else is served here. A rollout started without an id gets one this process owns, so with
N processes about (N-1)/N of a session's requests take one local hop, and never more than one: a passed-on
request is marked (``x-tokentrail-forwarded``) and served where it arrives, a mark believed only on the
peer port. What each process keeps is its own: its attempt registry, caches, Kafka producer and spool (a
spool directory per process). Every answer served here says by whom (``x-tokentrail-worker``), and
``/health`` adds the process, its peers and what it routed.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from producers.gateway.body import read_asgi_limited
from producers.gateway.errors import GatewayError, Protocol
from producers.gateway.sticky import (
    FORWARDED_HEADER,
    MODEL_PATHS,
    START_PATH,
    Route,
    RoutingPolicy,
    header_map,
    mint_owned_rollout_id,
    owner,
    owner_of,
    route_of,
    wants_body,
)
from producers.upstreams.http1 import Http1Pool, TransportError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

WORKER_HEADER = b"x-tokentrail-worker"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # gateway.max_body_bytes' default
# Set per connection or by the sending server; never relayed.
_HOP_BY_HOP = frozenset({b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding",
                         b"date", b"server", b"upgrade", b"te", b"trailer"})

class StickyRouter:
    """ASGI middleware: serve here what this process owns, pass the rest to the owner (see the module)."""

    def __init__(self, app: App, process: int, peer_urls: list[str], policy: RoutingPolicy | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app, self.process, self.peer_urls = app, process, peer_urls
        self.max_body_bytes = max_body_bytes  # the app's own limit, applied before a body is buffered here
        self.policy = policy or RoutingPolicy()
        self.processes = len(peer_urls)
        self.peer_port = urlsplit(peer_urls[process]).port
        self.pool = Http1Pool(timeout_s=900.0)
        self.forwarded = 0  # requests passed to another process
        self.routed: Counter[str] = Counter()  # requests with a session, by kind (sticky.Route.kind)
        self._worker = str(process).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/health" and scope["method"] == "GET":
            await self._health(scope, receive, send)
            return
        if self.processes == 1 or self._forwarded_here(scope):
            await self.app(scope, receive, self._stamped(send))
            return
        try:
            await self._route(scope, receive, send)
        except GatewayError as exc:  # a body over the limit: refused before more of it is read
            await _refuse(exc, scope["path"], send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        if path == START_PATH and scope["method"] == "POST":
            await self._start(scope, receive, send)
            return
        headers = header_map(scope["headers"])
        body: bytes | None = None
        if wants_body(path, headers, self.policy):  # an organic session keyed by a field of the body
            body = await self._read_body(scope, receive)
            route = route_of(path, headers, self.policy, _json_object(body))
        else:
            route = route_of(path, headers, self.policy)
        target = self._owner(route)
        if target != self.process:
            if body is None:
                body = await self._read_body(scope, receive)
            await self._forward(target, scope, body, send)
            return
        await self.app(scope, receive if body is None else _replay(body, receive), self._stamped(send))

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        return await read_asgi_limited(receive, header_map(scope["headers"]).get("content-length"),
                                       self.max_body_bytes)

    def _owner(self, route: Route | None) -> int:
        if route is None:
            return self.process
        self.routed[route.kind] += 1
        return owner(route, self.processes)

    def _forwarded_here(self, scope: Scope) -> bool:
        """A request a peer passed on (marked, and on the peer port: a client cannot skip the routing)."""
        server = scope.get("server")
        return bool(server and server[1] == self.peer_port
                    and any(name == FORWARDED_HEADER for name, _ in scope["headers"]))

    def _stamped(self, send: Send) -> Send:
        """``send`` that adds which process served the request to the response's headers."""
        async def stamped(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (WORKER_HEADER, self._worker)]
            await send(message)
        return stamped

    def describe(self) -> dict[str, Any]:
        """Which process this is, the peers it knows and what it routed (``/health``'s ``worker``)."""
        return {"index": self.process, "pid": os.getpid(), "processes": self.processes,
                "peers": self.peer_urls, "forwarded": self.forwarded, "routed": dict(self.routed)}

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app's /health with ``worker`` added (each process answers for itself)."""
        start: dict[str, Any] = {}
        parts: list[bytes] = []

        async def capture(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            else:
                parts.append(message.get("body", b""))

        await self.app(scope, receive, capture)
        body = b"".join(parts)
        try:
            health = orjson.loads(body)
        except orjson.JSONDecodeError:
            health = None
        if isinstance(health, dict):
            body = orjson.dumps({**health, "worker": self.describe()})
        headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"content-length"]
        headers += [(b"content-length", str(len(body)).encode()), (WORKER_HEADER, self._worker)]
        await send({"type": "http.response.start", "status": start.get("status", 500), "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _start(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A rollout's start: by its given id's owner, else here under an id this process owns."""
        body = await self._read_body(scope, receive)
        try:
            start = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            start = None  # malformed: the app says so
        if isinstance(start, dict):
            given = start.get("rollout_id")
            if isinstance(given, str) and given:
                target = owner_of(given, self.processes)
                self.routed["rollout"] += 1
                if target != self.process:
                    await self._forward(target, scope, body, send)
                    return
            elif given is None:
                start["rollout_id"] = mint_owned_rollout_id(self.process, self.processes)
                body = orjson.dumps(start)
        await self.app(scope, _replay(body, receive), self._stamped(send))

    async def _forward(self, target: int, scope: Scope, body: bytes, send: Send) -> None:
        self.forwarded += 1
        url = self.peer_urls[target] + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]
        headers.append((FORWARDED_HEADER, b"1"))
        try:
            response = await self.pool.request(scope["method"], url, body, headers)
        except TransportError as exc:
            message = orjson.dumps({"error": {"message": f"the gateway process that owns this session "
                                              f"({target}) did not answer: {exc}", "type": "unavailable",
                                              "code": "peer_unavailable"}})
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")]})
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


async def _refuse(exc: GatewayError, path: str, send: Send) -> None:
    """``exc`` as the route's protocol renders it (Anthropic for /v1/messages, the environment API's shape
    for /v1/rollouts and /v1/sessions, OpenAI's otherwise); the connection closes, the rest unread."""
    protocol: Protocol = ("anthropic" if "/v1/messages" in path
                          else "openai" if any(path.endswith(p) for p in MODEL_PATHS) else "env")
    body = orjson.dumps(exc.body(protocol))
    await send({"type": "http.response.start", "status": exc.status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, None when it is not one (the app refuses it; routing only needs a guess)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


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
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
