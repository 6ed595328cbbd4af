"""Issue 29, High 1: the process router read whole bodies before any limit or key. Against the real
``tokentrail gateway --processes 2``: a 64 MiB ``POST /v1/rollouts`` (declared, and streamed chunked without a
length) and a 64 MiB model call naming another worker's rollout are refused with 413 once the limit
(``gateway.max_body_bytes``) is passed, no worker's peak memory grows by the body, and a rollout driven
before and after still has every call on Kafka."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from producers.gateway.sticky import mint_owned_rollout_id

from .helpers import read_records
from .test_gateway_processes import MODEL, Gateway, _openai, gateway  # noqa: F401  (the fixture)

BODY_MIB = 64
LIMIT_MIB = 8  # gateway.max_body_bytes' default


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def _post_huge(url: str, path: str, headers: dict[str, str], *, chunked: bool) -> tuple[int | None, int]:
    """POST ``BODY_MIB`` MiB to ``path``; (the status answered, or None if the peer cut us off first, MiB sent)."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {BODY_MIB << 20}"
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{head}{framing}\r\n\r\n"
                 .encode())
    piece = b'{"x":"' + b"a" * ((1 << 20) - 6)
    sent = 0
    try:
        for _ in range(BODY_MIB):
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            sent += 1
    except OSError:
        pass  # the gateway answered and closed: what we still had to send is refused
    try:
        answer = sock.recv(4096)
    except OSError:
        answer = b""
    sock.close()
    status = int(answer.split()[1]) if answer.startswith(b"HTTP/1.1") else None
    return status, sent


def _one_rollout(gw: Gateway, calls: int) -> str:
    start = httpx.post(f"{gw.url}/v1/rollouts", json={"task_input": {"q": 1}}, timeout=30).json()
    for n in range(calls):
        with _openai(start["openai_base_url"]) as client:
            client.chat.completions.create(model=MODEL, max_tokens=2, temperature=0,
                                           messages=[{"role": "user", "content": f"hello {n}"}])
    return str(start["rollout_id"])


@pytest.mark.slow
def test_huge_bodies_are_refused_at_the_front_without_buffering(gateway: Gateway) -> None:  # noqa: F811
    gw = gateway
    before = _one_rollout(gw, 2)
    pids = [gw.health(n)["worker"]["pid"] for n in range(2)]
    peaks = [_peak_rss_mib(pid) for pid in pids]
    other = mint_owned_rollout_id(1, 2)  # owned by worker 1: what lands on worker 0 is passed on
    outcomes = [
        _post_huge(gw.url, "/v1/rollouts", {}, chunked=True),
        _post_huge(gw.url, "/v1/rollouts", {}, chunked=False),
        _post_huge(gw.workers[0], "/v1/chat/completions", {"x-rollout-id": other}, chunked=True),
    ]
    grown = [_peak_rss_mib(pid) - peak for pid, peak in zip(pids, peaks, strict=True)]
    print(f"(status, MiB sent) per hostile body: {outcomes}; workers' peak RSS grew by {grown} MiB")
    for status, sent in outcomes:
        assert status in (413, None), outcomes
        assert sent < BODY_MIB, f"the gateway read all {BODY_MIB} MiB of a body over its {LIMIT_MIB} MiB limit"
    assert any(status == 413 for status, _ in outcomes), outcomes
    assert max(grown) < 3 * LIMIT_MIB, f"peak RSS grew by {grown} MiB for {BODY_MIB} MiB bodies"
    assert [gw.health(n)["worker"]["pid"] for n in range(2)] == pids  # no worker died of it
    after = _one_rollout(gw, 2)
    for rollout_id in (before, after):
        records = read_records(gw.settings, gw.topics["calls_topic"], 2, where={"rollout_id": rollout_id})
        assert sorted(r["call_index"] for _, r in records) == [0, 1]


def test_the_router_reads_no_more_than_the_limit() -> None:
    """The same in one process, cheaply: how much of a 64 MiB body the router pulls before answering."""
    import asyncio

    from producers.gateway.peers import StickyRouter
    from producers.gateway.sticky import owner_of

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def run() -> list[tuple[str, int, int]]:
        router = StickyRouter(app, 0, ["http://127.0.0.1:1", "http://127.0.0.1:2"], max_body_bytes=LIMIT_MIB << 20)
        other = next(f"r{i}" for i in range(99) if owner_of(f"r{i}", 2) == 1)
        seen = []
        statuses: list[int] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        for path, headers in (("/v1/rollouts", []), ("/v1/chat/completions", [(b"x-rollout-id", other.encode())]),
                              ("/v1/rollouts", [(b"content-length", str(BODY_MIB << 20).encode())])):
            pulled = 0

            async def receive() -> dict[str, Any]:
                nonlocal pulled
                pulled += 1
                return {"type": "http.request", "body": b"x" * (1 << 20), "more_body": pulled < BODY_MIB}

            scope = {"type": "http", "path": path, "method": "POST", "headers": headers, "query_string": b"",
                     "server": ("127.0.0.1", 9)}
            await router(scope, receive, send)
            seen.append((path, statuses[-1], pulled))
        return seen

    seen = asyncio.run(run())
    assert [status for _, status, _ in seen] == [413, 413, 413], seen
    assert [pulled for _, _, pulled in seen] == [LIMIT_MIB + 1, LIMIT_MIB + 1, 0], seen
