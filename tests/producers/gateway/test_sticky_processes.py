"""Several gateway processes behind one port (producers/gateway/peers.py, sticky.py): every request about a
rollout reaches the process that owns it, passed on over a real HTTP hop when it landed elsewhere; a
rollout started without an id gets one its starting process owns. Two routers run here in one event loop
in front of small ASGI apps that say which process answered (the real gateway runs as two worker processes
in test_gateway_processes.py and tests/bench/test_gateway.py; every kind of session in
test_session_routing.py)."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from typing import Any
from urllib.parse import quote

import orjson
import uvicorn

from producers.gateway.peers import StickyRouter
from producers.gateway.sticky import RoutingPolicy, mint_owned_rollout_id, owner, owner_of, route_of
from producers.upstreams.http1 import Http1Pool


def test_ownership_is_stable_spread_and_minted_ids_are_owned() -> None:
    ids = [f"rollout-{n}" for n in range(2000)]
    assert [owner_of(r, 2) for r in ids] == [owner_of(r, 2) for r in ids]
    spread = Counter(owner_of(r, 3) for r in ids)
    assert set(spread) == {0, 1, 2} and min(spread.values()) > 500
    for process in range(3):
        assert owner_of(mint_owned_rollout_id(process, 3), 3) == process
    policy = RoutingPolicy()
    by_path = route_of("/rollouts/r1/attempts/a1/v1/chat/completions", {}, policy)
    assert by_path is not None and by_path == route_of("/v1/rollouts/r1/attempts/a2/finish", {}, policy)
    assert by_path == route_of("/v1/chat/completions", {"x-rollout-id": "r1"}, policy)
    assert route_of("/v1/chat/completions", {"authorization": "Bearer x"}, policy) is None
    assert route_of("/v1/rollouts", {}, policy) is None


def test_a_sessions_calls_and_its_windows_rollouts_have_one_owner() -> None:
    """Issue 29, finding 5: calls of an organic session are routed by its key, a restart rebuilds its open window
    by the window's rollout id; both must name the same process, or the window is rebuilt by a process its calls
    never reach (before: 164 of 200 sessions with 4 processes)."""
    policy = RoutingPolicy(organic_sessions=True)
    for processes in (2, 3, 4):
        wrong = []
        for n in range(200):
            key = f"user-{n}"
            by_key = route_of("/v1/chat/completions", {"x-session-id": key}, policy)
            assert by_key is not None and by_key.kind == "session"
            for window_start_us in (1_700_000_000_000_000, 1_800_000_000_000_123):
                rollout_id = policy.refs.rollout_id_for(key, window_start_us)
                by_path = route_of(f"/rollouts/{rollout_id}/attempts/a1/v1/chat/completions", {}, policy)
                assert by_path is not None
                if not owner(by_key, processes) == owner_of(rollout_id, processes) == owner(by_path, processes):
                    wrong.append((key, window_start_us))
        assert wrong == [], f"{len(wrong)} of 400 windows owned elsewhere than their calls with {processes} processes"
    # Other rollout ids keep their own tag, spread over the processes.
    assert len({owner_of(f"rollout-{n}", 4) for n in range(100)}) == 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _echo(process: int) -> Any:
    """An app that answers which process it is, what it was asked, and (``?stream``) in several chunks."""
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        answer = orjson.dumps({"process": process, "path": scope["path"], "body": body.decode(),
                               "header": dict(scope["headers"]).get(b"x-test", b"").decode(),
                               "raw_path": scope["raw_path"].decode(),
                               "host": dict(scope["headers"])[b"host"].decode()})
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/plain")]})
        if scope["query_string"] == b"stream":
            for piece in (b"data: one\n\n", b"data: two\n\n", answer):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.body", "body": answer})
    return app


def test_requests_reach_the_process_that_owns_their_rollout() -> None:
    asyncio.run(_two_processes())


async def _two_processes() -> None:
    ports = [_free_port(), _free_port()]
    peers = [f"http://127.0.0.1:{p}" for p in ports]
    routers = [StickyRouter(_echo(n), n, peers) for n in range(2)]
    servers = [uvicorn.Server(uvicorn.Config(r, host="127.0.0.1", port=p, log_level="warning"))
               for r, p in zip(routers, ports, strict=True)]
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    client = Http1Pool()
    try:
        while not all(s.started for s in servers):
            await asyncio.sleep(0.05)
        owned_by_1 = mint_owned_rollout_id(1, 2)
        # Landed on process 0, owned by 1: passed on, headers, body and a streamed answer intact.
        response = await client.request("POST", f"{peers[0]}/rollouts/{owned_by_1}/attempts/a/v1/chat/completions"
                                        "?stream", b'{"x": 1}', [(b"x-test", b"kept")])
        status, text = response.status_code, await response.read()
        assert status == 201 and text.startswith(b"data: one\n\ndata: two\n\n")
        answer = orjson.loads(text[len(b"data: one\n\ndata: two\n\n"):])
        path = f"/rollouts/{owned_by_1}/attempts/a/v1/chat/completions"
        assert answer == {"process": 1, "path": path, "body": '{"x": 1}', "header": "kept", "raw_path": path,
                          "host": f"127.0.0.1:{ports[0]}"}  # the client's Host, not the peer's private address
        assert routers[0].forwarded == 1
        # Passed on as sent (issue 29, finding 9): percent-encoding decoded once, by the owner, and the Host kept.
        odd = "r%25 x?#"
        owned_odd = next(f"{odd}{n}" for n in range(100) if owner_of(f"{odd}{n}", 2) == 1)
        encoded = quote(owned_odd, safe="")
        response = await client.request("POST", f"{peers[0]}/v1/rollouts/{encoded}/attempts/a/events", b"{}",
                                        host=b"gateway.example:8443")
        answer = orjson.loads(await response.read())
        assert answer["process"] == 1 and answer["path"] == f"/v1/rollouts/{owned_odd}/attempts/a/events"
        assert answer["raw_path"] == f"/v1/rollouts/{encoded}/attempts/a/events"
        assert answer["host"] == "gateway.example:8443" and routers[0].forwarded == 2
        # Owned here: served here. Named by header: routed by it.
        status, text = await client.post(f"{peers[1]}/v1/rollouts/{owned_by_1}/attempts/a/finish", b"{}")
        assert orjson.loads(text)["process"] == 1 and routers[1].forwarded == 0
        response = await client.request("POST", f"{peers[0]}/v1/chat/completions", b"{}",
                                        [(b"x-rollout-id", owned_by_1.encode())])
        assert orjson.loads(await response.read())["process"] == 1
        # A start without an id gets one the receiving process owns; with an id, its owner serves it.
        for n in range(2):
            status, text = await client.post(f"{peers[n]}/v1/rollouts", b'{"task_input": {"q": 1}}')
            answer = orjson.loads(text)
            start = orjson.loads(answer["body"])
            assert answer["process"] == n and start["task_input"] == {"q": 1}
            assert owner_of(start["rollout_id"], 2) == n
        status, text = await client.post(f"{peers[0]}/v1/rollouts", orjson.dumps({"rollout_id": owned_by_1}))
        assert orjson.loads(text)["process"] == 1
        # Requests that name no rollout stay where they land.
        status, text = await client.post(f"{peers[0]}/v1/chat/completions", b"{}")
        assert orjson.loads(text)["process"] == 0
    finally:
        await client.aclose()
        for router in routers:
            await router.pool.aclose()
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*tasks)
