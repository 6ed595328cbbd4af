"""The syncer's decisions over a fleet: which servers it updates, which it reports, which it routes to.

The vLLM servers are stand-ins that answer vLLM's weight-update endpoints over httpx's in-process
transport (what they answer is recorded live in docs/weight-sync.md; the real server is exercised by
tests/producers/upstreams/vllm_live/test_weight_sync_live.py). The policy store is the real one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import httpx
import torch

from models.policy_store import PolicyStore
from trainer_consumer.weight_sync import FleetView, ServerStatus, WeightSync


class StandInServer:
    def __init__(self) -> None:
        self.label = "default"
        self.loaded: str | None = None
        self.paused = False
        self.up = True
        self.fail_reload = False
        self.log: list[str] = []

    def restart(self) -> None:
        self.label, self.loaded, self.paused, self.up = "default", None, False, True

    def answer(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        self.log.append(path)
        body = json.loads(request.content) if request.content else {}
        if path == "/weight_info":
            return httpx.Response(200, json={"weight_version": self.label})
        if path == "/pause":
            self.paused = True
            return httpx.Response(200, json={"status": "paused"})
        if path == "/resume":
            self.paused = False
            return httpx.Response(200, json={"status": "resumed"})
        if path == "/collective_rpc":
            if body.get("method") != "reload_weights":  # as vLLM answers a method its workers do not have
                return httpx.Response(500, json={"error": {"message": f"'Worker' has no attribute {body['method']!r}"}})
            if self.fail_reload:
                return httpx.Response(500, json={"error": {"message": "reload failed"}})
            self.loaded = body["kwargs"]["weights_path"]
            return httpx.Response(200, json={"results": [None]})
        if path == "/reset_prefix_cache":
            return httpx.Response(200, json={"success": True})
        if path == "/update_weight_version":
            self.label = body["new_version"]
            return httpx.Response(200, json={"success": True, "new_version": self.label})
        return httpx.Response(404, json={"detail": "Not Found"})


class RecordingHooks:
    def __init__(self) -> None:
        self.routed: list[list[str]] = []

    async def before_update(self, version: int, servers: Sequence[str]) -> None:
        return None

    async def after_update(self, view: FleetView) -> None:
        self.routed.append(view.routable())


def test_fleet_follows_the_store_and_a_restarted_or_failed_server_is_routed_only_once_current(
    tmp_path: Path,
) -> None:
    servers = {"http://a": StandInServer(), "http://b": StandInServer()}
    transport = httpx.MockTransport(lambda r: servers[f"{r.url.scheme}://{r.url.host}"].answer(r))
    store = PolicyStore(tmp_path / "policies")
    hooks = RecordingHooks()

    async def scenario() -> None:
        sync = WeightSync(list(servers), store, hooks=hooks, base_dir=tmp_path / "base",
                          client=httpx.AsyncClient(transport=transport))
        try:
            assert await sync.tick() is None  # both answer "default": version 0, routable
            assert hooks.routed == [["http://a", "http://b"]]

            store.publish(1, {"w": torch.ones(2)})
            report = await sync.tick()
            assert report is not None and report.ok and report.updated == ["http://a", "http://b"]
            assert {s.label for s in servers.values()} == {"1"}
            assert all(s.loaded == str(store.path(1)) and not s.paused for s in servers.values())

            servers["http://b"].up = False  # killed: it leaves routing at the next tick
            assert await sync.tick() is None
            assert hooks.routed[-1] == ["http://a"]
            assert sync.view.servers["http://b"].status is ServerStatus.UNREACHABLE

            servers["http://b"].restart()  # back on the base weights: updated before it is routed
            report = await sync.tick()
            assert report is not None and report.updated == ["http://b"]
            assert servers["http://b"].label == "1" and hooks.routed[-1] == ["http://a", "http://b"]

            servers["http://a"].fail_reload = True
            store.publish(2, {"w": torch.full((2,), 2.0)})
            report = await sync.tick()
            assert report is not None and list(report.failed) == ["http://a"]
            assert servers["http://a"].label == "incomplete-2"  # never the old label over half-loaded weights
            assert not servers["http://a"].paused  # resumed, but out of routing
            assert hooks.routed[-1] == ["http://b"]

            servers["http://a"].fail_reload = False  # retried at the next tick
            report = await sync.tick()
            assert report is not None and report.updated == ["http://a"]
            assert hooks.routed[-1] == ["http://a", "http://b"]
            assert await sync.tick() is None  # nothing to do
        finally:
            await sync.close()

    asyncio.run(scenario())
