"""Moving only what changed, and updates in flight, against stand-in servers (the real vLLM: the live test
tests/producers/upstreams/vllm_live/test_in_flight_update_live.py).

A version published with a delta is loaded from the delta when the server holds the delta's base, and from the
full checkpoint otherwise (a server behind by two versions, a corrupted delta file, a delta load that fails).
Under pause mode ``keep`` the prefix cache is reset with the running requests preempted, and an update whose
reset does not happen fails (the old weights' KV must not serve the new ones).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import torch

from models.policy_delta import DELTA_DIR, DELTA_WEIGHTS, plan_delta, read_delta, weight_group
from models.policy_store import PolicyStore
from trainer_consumer.weight_sync import VersionGate, WeightSync

from .test_syncer_fleet import StandInServer

BASE = {"model.embed_tokens.weight": torch.ones(4, 2), "model.layers.0.self_attn.q_proj.weight": torch.ones(2, 2),
        "model.layers.0.mlp.up_proj.weight": torch.ones(2, 2),
        "model.layers.1.self_attn.q_proj.weight": torch.ones(2, 2), "lm_head.weight": torch.ones(4, 2)}


def changed(weights: dict[str, torch.Tensor], name: str, value: float) -> dict[str, torch.Tensor]:
    out = dict(weights)
    out[name] = weights[name].clone()
    out[name][0, 0] = value
    return out


def test_a_delta_holds_the_changed_groups_whole_and_counts_the_bytes() -> None:
    assert weight_group("model.layers.12.mlp.up_proj.weight") == "model.layers.12"
    assert weight_group("lm_head.weight") == "lm_head"
    plan = plan_delta(BASE, changed(BASE, "model.layers.0.mlp.up_proj.weight", 5.0))
    assert plan is not None
    assert plan.groups == ("model.layers.0",)
    # the whole layer moves (vLLM fuses its projections), though one element changed
    assert plan.tensors == ("model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.q_proj.weight")
    assert (plan.delta_bytes, plan.changed_bytes, plan.full_bytes) == (32, 4, 112)
    assert plan_delta(BASE, {**BASE, "extra": torch.ones(1)}) is None  # not a delta: a full load
    assert plan_delta(BASE, {**BASE, "lm_head.weight": torch.ones(2, 4)}) is None


class ResettingServer(StandInServer):
    """Records the prefix-cache resets; ``reset_fails``: vLLM answers success false (blocks still held)."""

    def __init__(self) -> None:
        super().__init__()
        self.resets: list[str] = []
        self.reset_fails = False

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/reset_prefix_cache":
            self.resets.append(request.url.query.decode())
            return httpx.Response(200, json={"success": not self.reset_fails})
        return super().answer(request)


def test_delta_when_the_server_holds_the_base_else_the_full_checkpoint(tmp_path: Path) -> None:
    server = ResettingServer()
    store = PolicyStore(tmp_path / "policies")
    v1 = changed(BASE, "lm_head.weight", 2.0)
    v2 = changed(v1, "model.layers.1.self_attn.q_proj.weight", 3.0)
    v3 = changed(v2, "model.layers.0.self_attn.q_proj.weight", 4.0)
    v4 = changed(v3, "model.embed_tokens.weight", 5.0)

    async def scenario() -> None:
        sync = WeightSync(["http://a"], store, base_dir=tmp_path / "base", pause_mode="keep",
                          client=httpx.AsyncClient(transport=httpx.MockTransport(server.answer)))
        try:
            store.publish(1, v1, delta=True)  # nothing before it in the store: no delta
            report = await sync.tick()
            assert report is not None and report.loads == {"http://a": "full (published without a delta)"}
            assert report.bytes_moved["http://a"] == store.info(1).weights_path.stat().st_size
            assert server.resets == ["reset_running_requests=true"]  # keep: running requests recompute

            store.publish(2, v2, delta=True)
            report = await sync.tick()
            assert report is not None and report.ok and report.loads == {"http://a": "delta"}
            assert server.loaded == str(store.path(2) / DELTA_DIR) and server.label == "2"
            delta = read_delta(store.path(2))
            assert delta is not None and delta.groups == ("model.layers.1",)
            assert report.bytes_moved["http://a"] == delta.delta_bytes < delta.full_bytes

            store.publish(3, v3, delta=True)
            store.publish(4, v4, delta=True)  # the server skipped 3: the delta of 4 is against 3
            report = await sync.tick()
            assert report is not None and report.loads == {
                "http://a": "full (server holds version 2, the delta is against 3)"}
            assert server.loaded == str(store.path(4)) and server.label == "4"

            store.publish(5, changed(v4, "lm_head.weight", 6.0), delta=True)
            (store.path(5) / DELTA_DIR / DELTA_WEIGHTS).write_bytes(b"torn")  # a corrupted delta
            report = await sync.tick()
            assert report is not None and report.ok and report.loads == {"http://a": "full (delta checksum mismatch)"}
            assert server.loaded == str(store.path(5))

            store.publish(6, changed(v4, "lm_head.weight", 7.0), delta=True)
            server.reset_fails = True  # the old weights' KV stays: the update fails and says why
            report = await sync.tick()
            assert report is not None and not report.ok and "not reset" in report.failed["http://a"]
            assert server.label == "incomplete-6" and not server.paused
        finally:
            await sync.close()

    asyncio.run(scenario())


def test_a_failing_delta_load_falls_back_to_the_full_checkpoint(tmp_path: Path) -> None:
    server = ResettingServer()
    store = PolicyStore(tmp_path / "policies")
    store.publish(1, BASE)

    class DeltaRefused(ResettingServer):
        def answer(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/collective_rpc" and Path(
                    json.loads(request.content)["kwargs"].get("weights_path", "")).name == DELTA_DIR:
                return httpx.Response(500, json={"error": {"message": "shape mismatch"}})
            return super().answer(request)

    server = DeltaRefused()
    server.label = "1"

    async def scenario() -> None:
        sync = WeightSync(["http://a"], store, initial_target=1,
                          client=httpx.AsyncClient(transport=httpx.MockTransport(server.answer)))
        try:
            await sync.check()
            store.publish(2, changed(BASE, "lm_head.weight", 9.0), delta=True)
            report = await sync.tick()
            assert report is not None and report.ok and server.label == "2"
            assert report.loads["http://a"].startswith("full (delta load failed")
            assert server.loaded == str(store.path(2))
            assert server.resets == [""]  # wait: no request runs, a plain reset
        finally:
            await sync.close()

    asyncio.run(scenario())


def test_hold_keeps_new_calls_out_without_waiting_for_running_ones() -> None:
    async def scenario() -> None:
        gate = VersionGate(1)
        async with gate.lease() as leased:
            await asyncio.wait_for(gate.hold(), 1)  # returns with a call running
            waiting = asyncio.ensure_future(gate.lease().__aenter__())
            await asyncio.sleep(0.05)
            assert leased == 1 and not waiting.done()
            await gate.reopen(2)
            assert await asyncio.wait_for(waiting, 1) == 2
    asyncio.run(scenario())
