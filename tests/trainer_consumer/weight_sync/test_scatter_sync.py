"""Transfer "scatter": the sync sends a server only the version's element delta, the server's workers write it
into their parameters in place (the real worker extension, ``vllm_scatter.ScatterExtension``, run by a
stand-in server over httpx's in-process transport on a stand-in engine with vLLM's fused, packed layout), and
anything else is a full load followed by a new prepare. The real vLLM: vllm_live/test_scatter_live.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import torch
from safetensors.torch import load_file

from models.policy_delta import ELEMENTS_DIR, ELEMENTS_WEIGHTS, read_element_delta
from models.policy_store import PolicyStore
from trainer_consumer.weight_sync import WeightSync
from trainer_consumer.weight_sync.vllm_scatter import PREPARE, RELOAD_CHECK, SCATTER, ScatterExtension

from .test_engine_weights import checkpoint, engine, outputs, sparse
from .test_syncer_fleet import StandInServer


class Worker(ScatterExtension):
    """What vLLM's worker offers the extension: its config and its model."""

    def __init__(self) -> None:
        parallel = SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1)
        self.vllm_config = SimpleNamespace(parallel_config=parallel, model_config=SimpleNamespace(quantization=None))
        self.model = torch.nn.Module()
        self.model_runner = SimpleNamespace(get_model=lambda: self.model)


class ScatterServer(StandInServer):
    """Loads each reload into its stand-in engine and runs the extension's methods as vLLM's RPC would."""

    def __init__(self, extension: bool = True, reload_check: dict[str, object] | None = None) -> None:
        super().__init__()
        self.worker = Worker()
        self.extension = extension
        self.reload_check = reload_check  # what the workers answer RELOAD_CHECK (None: the stand-in has no vLLM)
        self.calls: list[str] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/collective_rpc":
            return super().answer(request)
        body = json.loads(request.content)
        self.calls.append(body["method"])
        if body["method"] == "reload_weights":
            path = Path(body["kwargs"]["weights_path"]) / "model.safetensors"
            self.worker.model = engine(load_file(str(path)))
            return super().answer(request)
        if body["method"] == RELOAD_CHECK and self.reload_check is not None:
            return httpx.Response(200, json={"results": [self.reload_check]})
        if not self.extension or body["method"] not in (PREPARE, SCATTER):
            return httpx.Response(500, json={"error": {"message": f"'Worker' has no attribute {body['method']!r}"}})
        try:
            result = getattr(self.worker, body["method"])(**body["kwargs"])
        except Exception as exc:  # vLLM answers a failing worker method with 500
            return httpx.Response(500, json={"error": {"message": f"{type(exc).__name__}: {exc}"}})
        return httpx.Response(200, json={"results": [result]})


def _scatter_sync(server: ScatterServer, store: PolicyStore, tmp_path: Path, logs: list[str]) -> WeightSync:
    return WeightSync(["http://a"], store, base_dir=tmp_path / "base", transfer="scatter", log=logs.append,
                      client=httpx.AsyncClient(transport=httpx.MockTransport(server.answer)))


def test_a_scatter_moves_only_the_delta_and_any_mismatch_is_a_full_load(tmp_path: Path) -> None:
    server = ScatterServer()
    store = PolicyStore(tmp_path / "policies")
    v1 = checkpoint(1)
    v2, v3 = sparse(v1, 2), sparse(sparse(v1, 2), 3)
    v4 = sparse(v3, 4)
    logs: list[str] = []

    async def scenario() -> None:
        sync = _scatter_sync(server, store, tmp_path, logs)
        try:
            store.publish(1, v1, delta=True)
            report = await sync.tick()
            assert report is not None and report.loads == {"http://a": "full (published without a delta)"}
            # asked once whether it reloads in place (the stand-in cannot say: taken as able), then loaded and prepared
            assert server.calls == [RELOAD_CHECK, "reload_weights", PREPARE]

            store.publish(2, v2, delta=True)
            server.calls.clear()
            report = await sync.tick()
            assert report is not None and report.ok and report.loads == {"http://a": "scatter"}
            info = read_element_delta(store.path(2))
            assert info is not None and report.bytes_moved == {"http://a": info.nbytes}
            assert server.calls == [SCATTER] and server.label == "2"  # no checkpoint, no reload
            [worker] = report.scattered["http://a"]
            assert worker["bytes_read"] == info.nbytes and worker["elements"] == info.changed_elements
            assert all(torch.equal(a, b) for a, b in zip(outputs(server.worker.model), outputs(engine(v2)),
                                                         strict=True))

            store.publish(3, v3, delta=True)  # a torn delta: the workers refuse it, the full checkpoint loads
            path = store.path(3) / ELEMENTS_DIR / ELEMENTS_WEIGHTS
            torn = bytearray(path.read_bytes())
            torn[-1] ^= 0xFF
            path.write_bytes(bytes(torn))
            server.calls.clear()
            report = await sync.tick()
            assert report is not None and report.ok and server.label == "3"
            assert report.loads["http://a"].startswith("full (scatter failed:") and "sha256" in report.loads["http://a"]
            assert server.calls == [SCATTER, "reload_weights", PREPARE]

            store.publish(4, v4, delta=True)  # prepared again after the full load: scatters again
            report = await sync.tick()
            assert report is not None and report.loads == {"http://a": "scatter"}
            assert all(torch.equal(a, b) for a, b in zip(outputs(server.worker.model), outputs(engine(v4)),
                                                         strict=True))
        finally:
            await sync.close()

    asyncio.run(scenario())


def test_a_server_without_the_extension_loads_the_group_delta(tmp_path: Path) -> None:
    server = ScatterServer(extension=False)
    store = PolicyStore(tmp_path / "policies")
    logs: list[str] = []

    async def scenario() -> None:
        sync = _scatter_sync(server, store, tmp_path, logs)
        try:
            store.publish(1, checkpoint(1), delta=True)
            await sync.tick()
            assert any("cannot scatter element deltas" in line for line in logs)
            store.publish(2, sparse(checkpoint(1), 2), delta=True)
            report = await sync.tick()
            assert report is not None and report.ok and server.label == "2"
            # the changed groups whole, as under transfer "delta"
            assert report.loads == {"http://a": "delta"}
            assert server.loaded == str(store.path(2) / "delta")
        finally:
            await sync.close()

    asyncio.run(scenario())


def test_a_server_that_cannot_reload_in_place_keeps_its_weights_and_is_reported(tmp_path: Path) -> None:
    """vLLM's CPU build with a MoE model answers RELOAD_CHECK with a refusal (its experts are prepacked once): the sync
    neither pauses nor loads it, reports it FAILED with the reason, and asks only once."""
    refusal = "vLLM's CPU MoE kernel prepacks the experts of 2 layers once, at the first load"
    server = ScatterServer(reload_check={"in_place": False, "reason": refusal})
    logs: list[str] = []
    store = PolicyStore(tmp_path / "policies")
    store.publish(1, checkpoint(1), delta=True)

    async def twice() -> list[Any]:
        sync = _scatter_sync(server, store, tmp_path, logs)
        try:
            return [await sync.sync_to(1) for _ in range(2)]
        finally:
            await sync.close()

    for report in asyncio.run(twice()):
        assert not report.ok and report.failed == {"http://a": refusal}, report
    assert server.calls == [RELOAD_CHECK]  # asked once; never reloaded
    assert server.label == "default" and server.loaded is None and not server.paused
    assert [line for line in logs if "is not updated in place" in line] == [
        f"weight sync: http://a is not updated in place: {refusal}"]
