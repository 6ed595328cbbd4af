"""The servers of a vLLM fleet over one HTTP/1.1 pool: which server a request goes to, and failing over.

Every call of a rollout goes to the same server (rendezvous hashing of the rollout id, so adding or removing
a server moves only that server's share), which keeps its prefix cache warm. A server that refuses the
connection, or goes away while taking the request, is skipped for the next one in the same order; a server
lost after that but before its answer was complete is left for the next one too, as long as nothing of the
answer reached the caller (the caller decides that for streams: ``lost``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from producers.upstreams.base import UpstreamError
from producers.upstreams.http1 import ConnectFailed, Http1Pool, Response, Timeout, TransportError
from producers.upstreams.vllm.errors import ServerLost, error_from_response

# How long a finished stream may take to end its body (vLLM ends it right after [DONE]) before its
# connection is closed instead of kept.
STREAM_END_WAIT_S = 1.0


def rendezvous_order(key: str, servers: Sequence[str]) -> list[str]:
    """Servers ordered by highest random weight for ``key``: the first is the sticky choice."""
    def weight(server: str) -> bytes:
        return hashlib.blake2b(f"{server}\0{key}".encode(), digest_size=8).digest()

    return sorted(servers, key=weight, reverse=True)


def server_list(servers: Sequence[str] | str) -> list[str]:
    """Base URLs (without ``/v1``) from a list or a comma-separated string, without trailing slashes."""
    if isinstance(servers, str):
        servers = [s for s in servers.split(",") if s.strip()]
    return [s.strip().rstrip("/") for s in servers]


@dataclass(frozen=True)
class Answer:
    """A whole (non-streamed) answer: its status and body."""

    status_code: int
    content: bytes


class OpenStream:
    """An already-sent streaming response as an async context manager that releases its connection."""

    def __init__(self, response: Response) -> None:
        self.response = response

    async def __aenter__(self) -> Response:
        return self.response

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:  # read past [DONE] to the body's end, so the connection is kept
            await self.response.drain(STREAM_END_WAIT_S)
        self.response.release()


class Fleet:
    """One or more vLLM servers (base URLs without ``/v1``) and the connections to them."""

    def __init__(self, servers: Sequence[str] | str, *, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.servers = server_list(servers)
        if not self.servers:
            raise ValueError("a vLLM fleet needs at least one server URL")
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = Http1Pool(headers, timeout_s=timeout_s)

    def order(self, route_key: str) -> list[str]:
        """Servers in the order a request routed by ``route_key`` tries them (the first unless it is down)."""
        return rendezvous_order(route_key, self.servers) if len(self.servers) > 1 else self.servers

    async def close(self) -> None:
        await self._client.aclose()

    async def get_json(self, server: str, path: str) -> dict[str, Any]:
        try:
            status, content = await self._client.get(server + path)
        except TransportError as exc:
            raise UpstreamError(f"vLLM ({server}) {path}: {exc}", 502, "upstream_unavailable") from exc
        if status != 200:
            raise error_from_response(status, content, server)
        return dict(orjson.loads(content))

    async def admin(self, server: str, path: str, body: dict[str, Any] | None) -> None:
        """POST an admin request to one server (no failover: it is about that server)."""
        try:
            status, content = await self._client.post(server + path, orjson.dumps(body) if body else b"")
        except TransportError as exc:
            raise UpstreamError(f"vLLM ({server}) {path}: {exc}", 502, "upstream_unavailable") from exc
        if status != 200:
            raise error_from_response(status, content, server)

    async def post(self, route_key: str, path: str, body: dict[str, Any]) -> tuple[str, Answer]:
        """POST and read the whole answer; a server lost before its answer was complete (killed, its
        connection broken) is left for the next one in the rollout's order: nothing reached the caller."""
        lost: list[str] = []
        while True:
            server, response = await self._send(route_key, path, body, skip=lost)
            try:
                return server, Answer(response.status_code, await response.read())
            except Timeout as exc:
                raise UpstreamError(f"vLLM ({server}) timed out: {exc}", 504, "upstream_timeout") from exc
            except TransportError as exc:
                lost.append(server)
                self.lost(server, exc, lost, route_key)

    async def open_stream(self, route_key: str, path: str, body: dict[str, Any],
                          skip: Sequence[str] = ()) -> tuple[str, OpenStream]:
        """POST a streaming request; an error status is read and raised, a 200 is returned unread."""
        server, response = await self._send(route_key, path, body, skip=skip)
        if response.status_code != 200:
            try:
                content = await response.read()
            except TransportError as exc:
                raise ServerLost(f"vLLM ({server}): {exc}", server) from exc
            raise error_from_response(response.status_code, content, server)
        return server, OpenStream(response)

    def lost(self, server: str, exc: Exception, lost: Sequence[str], route_key: str) -> None:
        """After losing ``server`` mid-request: raise when no other server is left to try."""
        if not [s for s in self.order(route_key) if s not in lost]:
            raise ServerLost(f"vLLM ({server}): {exc}; no other server to try", server) from exc

    async def _send(self, route_key: str, path: str, body: dict[str, Any],
                    skip: Sequence[str] = ()) -> tuple[str, Response]:
        """POST to the rollout's server (the next in its order when one cannot be reached or its connection
        breaks while sending); the answer's status is in, its body not yet read."""
        content = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)  # the prompt may be a uint32 array
        last: Exception | None = None
        for server in self.order(route_key):
            if server in skip:
                continue
            try:
                return server, await self._client.request("POST", server + path, content)
            except ConnectFailed as exc:
                last = exc  # never reached the server: the next one may take it
            except Timeout as exc:
                raise UpstreamError(f"vLLM ({server}) timed out: {exc}", 504, "upstream_timeout") from exc
            except TransportError as exc:
                last = exc  # it went away while taking the request (killed): nothing was sampled for anyone
        raise UpstreamError(f"no vLLM server reachable ({last})", 502, "upstream_unavailable")
