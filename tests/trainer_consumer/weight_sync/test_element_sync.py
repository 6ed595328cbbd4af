"""Element-delta weight sync (transfer "elements") against a stand-in server that records what its loader read:
the server gets exactly the published weights of the changed groups, no checkpoint is read, and any mismatch
(a torn delta, weights held that are not the delta's base, a server behind, a refused load) is a full load."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import torch
from safetensors.torch import load_file

from models.element_delta import cast_state, tensor_digest
from models.policy_delta import ELEMENTS_DIR, ELEMENTS_WEIGHTS, read_element_delta, weight_group
from models.policy_store import PolicyStore
from trainer_consumer.weight_sync import WeightSync

from .test_delta_and_keep import BASE, changed
from .test_syncer_fleet import StandInServer

BF16 = torch.bfloat16


class ReadingServer(StandInServer):
    """Reads the safetensors of every reload as vLLM's loader would, before the sync removes its files."""

    def __init__(self) -> None:
        super().__init__()
        self.read: dict[str, torch.Tensor] = {}
        self.refuse_staged = False

    def answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        if request.url.path == "/collective_rpc" and body.get("method") == "reload_weights":
            directory = Path(body["kwargs"]["weights_path"])
            if self.refuse_staged and directory.name.startswith(".elements-"):
                return httpx.Response(500, json={"error": {"message": "shape mismatch"}})
            self.read = {}
            for path in sorted(directory.glob("*.safetensors")):
                self.read.update(load_file(str(path)))
        return super().answer(request)


def test_only_the_changed_groups_load_exactly_and_any_mismatch_loads_the_full_checkpoint(tmp_path: Path) -> None:
    server = ReadingServer()
    store = PolicyStore(tmp_path / "policies")
    v1 = {name: t * 0.37 for name, t in BASE.items()}  # values bf16 rounds
    v2 = changed(v1, "model.layers.1.self_attn.q_proj.weight", 3.1)
    v3 = changed(v2, "model.layers.0.mlp.up_proj.weight", 4.2)
    v4 = changed(v3, "lm_head.weight", 5.3)

    def publish(version: int, weights: dict[str, torch.Tensor]) -> None:
        store.publish(version, weights, delta=True, engine_dtype=BF16)

    async def scenario() -> None:
        sync = WeightSync(["http://a"], store, base_dir=tmp_path / "base", transfer="elements", engine_dtype=BF16,
                          client=httpx.AsyncClient(transport=httpx.MockTransport(server.answer)))
        try:
            publish(1, v1)
            report = await sync.tick()
            assert report is not None and report.loads == {"http://a": "full (published without an element delta)"}

            publish(2, v2)
            report = await sync.tick()
            assert report is not None and report.ok and report.loads == {"http://a": "elements"}
            info = read_element_delta(store.path(2))
            assert info is not None and report.bytes_moved == {"http://a": info.nbytes}
            assert info.changed_elements == 1 and info.encodings == {"bitmask": 1}  # 1 + 2 bytes, not 4 + 2
            # the changed layer, whole (vLLM fuses its projections), exactly as published in bf16
            assert set(server.read) == {n for n in v2 if weight_group(n) == "model.layers.1"}
            published = cast_state(v2, BF16)
            assert all(tensor_digest(server.read[n]) == tensor_digest(published[n]) for n in server.read)
            assert report.bytes_reloaded == {"http://a": 8} and server.label == "2"

            publish(3, v3)
            path = store.path(3) / ELEMENTS_DIR / ELEMENTS_WEIGHTS
            torn = bytearray(path.read_bytes())
            torn[-1] ^= 0xFF
            path.write_bytes(bytes(torn))
            report = await sync.tick()
            assert report is not None and report.ok and server.label == "3"
            assert report.loads["http://a"].startswith("full (element delta mismatch:")
            assert "sha256" in report.loads["http://a"] and server.loaded == str(store.path(3))

            publish(4, v4)  # the copy the sync keeps of version 3 no longer holds what the engine holds
            held, _ = sync._mirrors[3]
            held.tensors["lm_head.weight"][1, 1] = 9.0  # type: ignore[index]
            report = await sync.tick()
            assert report is not None and report.ok and server.loaded == str(store.path(4))
            assert "lm_head.weight" in report.loads["http://a"] and "sha256" in report.loads["http://a"]

            publish(5, changed(v4, "lm_head.weight", 6.4))
            publish(6, changed(v4, "lm_head.weight", 7.5))  # the server skipped 5: 6's delta is against 5
            report = await sync.tick()
            assert report is not None and report.loads == {
                "http://a": "full (server holds version 4, the delta is against 5)"}

            publish(7, changed(v4, "lm_head.weight", 8.6))
            server.refuse_staged = True  # the engine refuses the reconstructed groups: the full checkpoint
            report = await sync.tick()
            assert report is not None and report.ok and server.label == "7"
            assert report.loads["http://a"].startswith("full (element delta load failed")
            assert server.loaded == str(store.path(7))
        finally:
            await sync.close()

    asyncio.run(scenario())


def test_an_element_delta_in_another_dtype_than_the_engine_serves_is_a_full_load(tmp_path: Path) -> None:
    server = ReadingServer()
    store = PolicyStore(tmp_path / "policies")

    async def scenario() -> None:
        sync = WeightSync(["http://a"], store, base_dir=tmp_path / "base", transfer="elements",
                          client=httpx.AsyncClient(transport=httpx.MockTransport(server.answer)))
        try:
            store.publish(1, BASE, delta=True, engine_dtype=BF16)
            await sync.tick()
            store.publish(2, changed(BASE, "lm_head.weight", 2.0), delta=True, engine_dtype=BF16)
            report = await sync.tick()  # the sync serves float32 (its default)
            assert report is not None and report.loads == {
                "http://a": "full (the element delta is in bfloat16, the engine serves float32)"}
        finally:
            await sync.close()

    asyncio.run(scenario())


def test_the_trainer_publishes_element_deltas_in_the_engine_dtype(tmp_path: Path) -> None:
    from trainer_consumer.policy import StorePublisher

    store = PolicyStore(tmp_path / "policies")
    publisher = StorePublisher(store, delta=True, engine_dtype="bfloat16")
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 4)
    publisher.publish(model, 1, {})
    with torch.no_grad():
        model.weight += 1e-5  # far below a bf16 step of these weights: almost nothing moves there
        model.bias[0] = 3.0
    publisher.publish(model, 2, {})
    info = read_element_delta(store.path(2))
    assert info is not None and info.dtype == "bfloat16" and info.base_version == 1
    # of 260: the bias element and the weights small or near a rounding edge (28 in all with this seed)
    assert 1 <= info.changed_elements < 64


def test_the_trainer_publishes_element_deltas_by_default(tmp_path: Path) -> None:
    """The default transfer (``scatter``) needs an element delta on every version after the first; the trainer's
    default settings publish one (before, ``trainer.publish_delta`` was off and every update was a full load)."""
    from trainer_consumer.policy import StorePublisher
    from trainer_consumer.settings import TrainerSettings
    from trainer_consumer.weight_sync.settings import WeightSyncSettings

    settings = TrainerSettings()
    assert settings.engine_dtype == WeightSyncSettings().engine_dtype  # the dtype the servers are synced in
    store = PolicyStore(tmp_path / "policies")
    publisher = StorePublisher.from_settings(store, settings)
    model = torch.nn.Linear(8, 2)
    publisher.publish(model, 1, {})
    with torch.no_grad():
        model.bias[1] = 5.0
    publisher.publish(model, 2, {})
    info = read_element_delta(store.path(2))
    assert info is not None and (info.base_version, info.dtype, info.changed_elements) == (1, "float32", 1)

