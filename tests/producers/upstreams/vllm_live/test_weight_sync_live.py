"""Weight sync on the real vLLM (CPU build): the trainer publishes a version, the sync reloads it into
the running server, the real gateway records that version on the next call, and the call's logprobs
are those of the new weights (a transformers forward pass on them), not of the old ones.

The session's server is shared with the other live tests, so each test puts the base weights back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch
from safetensors.torch import load_file

from models.policy_store import PolicyStore
from producers.gateway.text_side import ModelTextSide
from producers.sdk import Rollout
from producers.upstreams.weight_gate import GatedUpstream
from testkit.gateway import RunningGateway, free_port, running_gateway
from tokentrail.runtime.weight_sync import gate_upstream
from tokentrail.settings import Settings
from trainer_consumer.weight_sync import ServerStatus, WeightSync

from .records import full_prompts, output_of, read_calls, reference_logprobs
from .vllm_server import VLLMServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

LOGPROB_ATOL = 1e-3  # vLLM's CPU kernels vs transformers in float32 (observed ~1e-6)


def perturbed(base: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Weights far enough from ``base`` that sampling visibly changes (deterministic for a seed)."""
    generator = torch.Generator().manual_seed(seed)
    return {k: t + torch.randn(t.shape, generator=generator) * (t.float().std() + 0.02) for k, t in base.items()}


def restore_base(server: VLLMServer, model_dir: Path, store: PolicyStore) -> None:
    async def run() -> None:
        sync = WeightSync([server.url], store, base_dir=model_dir)
        try:
            report = await sync.sync_to(0)
            assert report.ok, report.failed
        finally:
            await sync.close()

    asyncio.run(run())


@contextmanager
def gated_gateway(server: VLLMServer, store: PolicyStore, model_dir: Path, settings: Settings,
                  text_side: ModelTextSide, topics: dict[str, str], spool: Path) -> Iterator[tuple[RunningGateway,
                                                                                                   GatedUpstream]]:
    from producers.delivery import CallPublisher
    from producers.gateway.app import create_app
    from producers.upstreams.vllm import VLLMUpstream
    from schemas.kafka.config import producer_config

    upstream = gate_upstream(VLLMUpstream([server.url], model=server.model_name, logprobs_mode=server.logprobs_mode),
                             store, base_dir=model_dir, interval_s=0.2)
    sink = CallPublisher(producer_config(settings.kafka), spool, settings.gateway.delivery_timeout_s)
    app = create_app(settings, upstream, sink, text_side, topics=topics, close_upstream=True, policy_dir=store.root)
    with running_gateway(app) as gw:
        yield gw, upstream


def wait_for(predicate: Any, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def one_call(gateway_url: str, model: str) -> str:
    """One chat call in a rollout of its own, sampled with a fixed seed; returns the rollout id."""
    with Rollout(gateway_url, task_input={"weight_sync": True}) as rollout:
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key="harness-key")
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a colour."}],
                                       max_tokens=12, temperature=1.0, seed=1234)
    return rollout.rollout_id


def test_a_published_version_is_served_by_vllm_and_recorded_on_the_next_call(
    vllm_server: VLLMServer, live_model_dir: Path, live_text_side: ModelTextSide, live_topics: dict[str, str],
    live_reference_model: Any, tokentrail_settings: Settings, tmp_path: Path,
) -> None:
    store = PolicyStore(tmp_path / "policies")
    model = tokentrail_settings.model.name
    base = load_file(str(live_model_dir / "model.safetensors"))
    try:
        with gated_gateway(vllm_server, store, live_model_dir, tokentrail_settings, live_text_side, live_topics,
                           tmp_path / "spool") as (gw, upstream):
            assert upstream.sync is not None
            sync = upstream.sync
            wait_for(lambda: sync.view.routable() == [vllm_server.url], "the first look at the fleet")
            before = one_call(gw.url, model)

            weights = perturbed(base, seed=1)
            published_at = time.monotonic()
            store.publish(1, weights, {"test": "weight sync"})  # what the trainer does
            wait_for(lambda: sync.view.target == 1 and sync.view.routable() == [vllm_server.url], "version 1")
            synced_s = time.monotonic() - published_at
            after = one_call(gw.url, model)

        label = httpx.get(f"{vllm_server.url}/weight_info", timeout=10).json()["weight_version"]
        report = sync.reports[-1]
        assert (report.version, report.ok, label) == (1, True, "1"), (report, label)
        assert 0 < report.paused_s[vllm_server.url] < synced_s < 60

        topic = live_topics["calls_topic"]
        [call_before] = read_calls(tokentrail_settings, topic, before, 1)
        [call_after] = read_calls(tokentrail_settings, topic, after, 1)
        assert (call_before["versions"]["policy_version"], call_after["versions"]["policy_version"]) == (0, 1)
        [prompt_before], [prompt_after] = full_prompts([call_before]), full_prompts([call_after])
        assert prompt_before.tolist() == prompt_after.tolist()  # the same request, the same seed ...
        ids_before, _ = output_of(call_before)
        ids_after, logprobs_after = output_of(call_after)
        assert ids_before != ids_after  # ... sampled by other weights

        # The recorded logprobs are those of version 1's weights, and clearly not those of version 0's.
        reference_v1 = live_reference_model.__class__.from_pretrained(str(live_model_dir), dtype=torch.float32)
        reference_v1.load_state_dict(weights)
        expected = reference_logprobs(reference_v1.eval(), call_after, prompt_after)
        np.testing.assert_allclose(logprobs_after, expected, atol=LOGPROB_ATOL)
        under_base = reference_logprobs(live_reference_model, call_after, prompt_after)
        assert float(np.max(np.abs(under_base - logprobs_after))) > 0.05
    finally:
        restore_base(vllm_server, live_model_dir, store)


def test_a_server_that_cannot_be_updated_is_reported_and_left_out_of_routing(
    vllm_server: VLLMServer, live_model_dir: Path, tmp_path: Path,
) -> None:
    store = PolicyStore(tmp_path / "policies")
    store.publish(1, perturbed(load_file(str(live_model_dir / "model.safetensors")), seed=2))
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there

    async def run() -> WeightSync:
        sync = WeightSync([vllm_server.url, dead], store, base_dir=live_model_dir, timeout_s=60)
        try:
            await sync.tick()
        finally:
            await sync.close()
        return sync

    try:
        sync = asyncio.run(run())
        report = sync.reports[-1]
        assert report.updated == [vllm_server.url]
        assert list(report.failed) == [dead] and "ConnectError" in report.failed[dead]
        assert sync.view.routable() == [vllm_server.url]
        assert sync.view.servers[dead].status is ServerStatus.UNREACHABLE
        label = httpx.get(f"{vllm_server.url}/weight_info", timeout=10).json()["weight_version"]
        assert label == "1"
        assert httpx.get(f"{vllm_server.url}/is_paused", timeout=10).json() == {"is_paused": False}
    finally:
        restore_base(vllm_server, live_model_dir, store)


def test_the_weight_sync_command_brings_the_server_to_the_published_version(
    vllm_server: VLLMServer, live_model_dir: Path, tmp_path: Path,
) -> None:
    import subprocess
    import sys

    from schemas.local_paths import REPO_ROOT

    store = PolicyStore(tmp_path / "policies")
    store.publish(3, perturbed(load_file(str(live_model_dir / "model.safetensors")), seed=3))
    command = [sys.executable, "-m", "tokentrail.cli", "weight-sync", "--servers", vllm_server.url,
               "--checkpoint-dir", str(store.root), "--base-dir", str(live_model_dir), "--once"]
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "weight sync to version 3: 1/1 servers" in done.stdout, done.stdout
        assert f"{vllm_server.url} v3 current" in done.stdout, done.stdout
        assert httpx.get(f"{vllm_server.url}/weight_info", timeout=10).json()["weight_version"] == "3"
    finally:
        restore_base(vllm_server, live_model_dir, store)
