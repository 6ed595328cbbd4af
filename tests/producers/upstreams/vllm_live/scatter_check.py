"""The scatter check on a live vLLM, for any model it serves: publish a perturbed version and a sparse step after
it, sync the step by element scatter, then by a full load of the same version, and compare the two servers'
answers (greedy tokens and top-5 logprobs). Used on the reference model (test_scatter_live.py) and on a model
family's directory (test_family_on_vllm.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors.torch import load_file

from models.policy_delta import read_element_delta
from models.policy_store import PolicyStore
from trainer_consumer.weight_sync import WeightSync

from .test_weight_sync_live import perturbed, restore_base
from .vllm_server import VLLMServer

PROMPTS = [[5, 17, 33, 41, 12, 9, 100, 200], [300, 301, 7, 7, 42], [11, 250, 499, 3, 64, 128, 77]]
TOP = 5


def sparse_step(state: dict[str, torch.Tensor], seed: int, share: float) -> dict[str, torch.Tensor]:
    """``state`` with ``share`` of each tensor's elements moved (by about its own spread)."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state.items():
        moved = torch.rand(tensor.shape, generator=generator) < share
        noise = torch.randn(tensor.shape, generator=generator) * (tensor.float().std() + 0.02)
        out[name] = torch.where(moved, tensor + noise, tensor)
    return out


async def answers(client: httpx.AsyncClient, server: VLLMServer) -> list[tuple[list[int], list[dict[str, float]]]]:
    """Greedy continuations of PROMPTS with the top-5 logprobs at every position."""
    out = []
    for prompt in PROMPTS:
        response = await client.post(f"{server.url}/v1/completions", timeout=120.0, json={
            "model": server.model_name, "prompt": prompt, "max_tokens": 8, "temperature": 0.0,
            "logprobs": TOP, "return_tokens_as_token_ids": True})
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        tokens = [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
        out.append((tokens, [dict(top) for top in choice["logprobs"]["top_logprobs"]]))
    return out


def max_gap(a: list[Any], b: list[Any]) -> float:
    """Largest logprob difference between two answers with the same tokens and the same top-5 ids."""
    gap = 0.0
    for (tokens_a, tops_a), (tokens_b, tops_b) in zip(a, b, strict=True):
        assert tokens_a == tokens_b
        for top_a, top_b in zip(tops_a, tops_b, strict=True):
            assert top_a.keys() == top_b.keys()
            gap = max(gap, max(abs(top_a[k] - top_b[k]) for k in top_a))
    return gap


@dataclass
class ScatterCheck:
    delta_bytes: int
    full_bytes: int
    worker: dict[str, Any]  # what the worker wrote, in place
    gap: float  # largest top-5 logprob difference, scatter vs full load of the same version
    moved: bool  # the version changed the model's answers


def scatter_then_full(server: VLLMServer, model_dir: Path, tmp_path: Path, *, share: float = 0.03) -> ScatterCheck:
    """Versions 1 (perturbed, full) and 2 (``share`` of the elements moved) published with deltas; version 2 synced
    by scatter and then by a full load, answers taken after each. The server is restored to the base after."""
    store = PolicyStore(tmp_path / "store")
    v1 = perturbed(load_file(str(model_dir / "model.safetensors")), seed=31)
    v2 = sparse_step(v1, seed=32, share=share)
    store.publish(1, v1, delta=True)
    store.publish(2, v2, delta=True)
    info = read_element_delta(store.path(2))
    # a small tensor (a per-head norm of 64 elements) may come through a 3% step unchanged: it is not in the delta
    changed = sum(not torch.equal(v1[name], v2[name]) for name in v2)
    assert info is not None and info.base_version == 1
    url = server.url
    logs: list[str] = []
    worker: dict[str, Any] = {}
    found: dict[str, Any] = {}

    async def scenario() -> None:
        scatter = WeightSync([url], store, base_dir=model_dir, transfer="scatter", log=logs.append)
        full = WeightSync([url], store, base_dir=model_dir, transfer="full")
        async with httpx.AsyncClient() as client:
            try:
                report = await scatter.sync_to(1)  # nothing to diff against: full, then the workers prepare
                assert report.ok and report.loads == {url: "full (published without a delta)"}, (report, logs)
                assert not [line for line in logs if "cannot scatter" in line], logs
                found["before"] = await answers(client, server)
                report = await scatter.sync_to(2)
                assert report.ok and report.loads == {url: "scatter"}, (report, logs)
                assert report.bytes_moved == {url: info.nbytes}  # the delta file, nothing else
                worker.update(report.scattered[url][0])
                assert worker["bytes_read"] == info.nbytes and worker["elements"] == info.changed_elements
                assert worker["tensors"] == changed, (changed, worker)  # every tensor the step moved
                found["scattered"] = await answers(client, server)
                report = await full.sync_to(2)  # the same server, loaded with the full checkpoint of version 2
                assert report.ok and report.loads == {url: "full"}
                found["loaded"] = await answers(client, server)
            finally:
                await scatter.close()
                await full.close()

    try:
        asyncio.run(scenario())
    finally:
        restore_base(server, model_dir, PolicyStore(tmp_path / "restore"))
    before, scattered = found["before"], found["scattered"]
    moved = [abs(top_a[k] - top_b[k]) for (_, tops_a), (_, tops_b) in zip(before, scattered, strict=True)
             for top_a, top_b in zip(tops_a, tops_b, strict=False) for k in top_a.keys() & top_b.keys()]
    return ScatterCheck(info.nbytes, info.full_bytes, worker, max_gap(scattered, found["loaded"]),
                        [t for t, _ in before] != [t for t, _ in scattered] or max(moved) > 1e-3)
