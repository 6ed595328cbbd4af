"""vLLM (CPU) loads a model family's directory as built here (models/families: qwen3's real vocabulary and
chat template, a tiny random-weight Qwen3) and renders a chat request to exactly the prompt ids the
gateway's family text side renders: vLLM's own /v1/chat/completions (``return_token_ids``) is the judge.
Served with the family's reference parsers (hermes tool calls, qwen3 reasoning).

The same server then takes the trainer's weight updates as the family's architecture lays them out in vLLM
(Qwen3: q/k norms per head beside the fused qkv_proj and gate_up_proj): an element delta scattered in place
answers exactly as a full load of the same version (scatter_check.py), so online training of the family moves
only what changed.

A MoE family on this CPU build is not updated in place: vLLM 0.32's CPU MoE kernel prepacks the experts once, at the
first load, and a reload would write plain values into the prepacked buffers (a qwen3-coder server reloaded with a
version answered otherwise than one started on it; for the dense families the two agree). The workers say so
(``tokentrail_reload_check``) and the sync keeps the server's weights and label, reporting it FAILED with the
reason, rather than label wrong weights with the new version."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.torch import load_file

from models.policy_store import PolicyStore
from testkit.gateway import free_port
from tests.producers.families.family_models import family_dir, family_text_side
from trainer_consumer.weight_sync import WeightSync

from .scatter_check import answers, max_gap, scatter_then_full
from .test_weight_sync_live import perturbed
from .vllm_server import start_vllm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look up the value of a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
# A tool round trip with reasoning, two parallel calls, consecutive tool messages and non-ASCII text.
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Answer with the lookup tool."},
    {"role": "user", "content": "What are fox and 猫?"},
    {"role": "assistant", "content": "", "reasoning": "I need both keys.", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "fox"}'}},
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key":"猫"}'}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "red"},
    {"role": "tool", "tool_call_id": "call_1", "content": "grau"},
]


def test_vllm_serves_a_family_dir_renders_the_gateways_prompt_and_takes_scattered_updates(
        vllm_installed: None, tmp_path: Path) -> None:
    model_dir = family_dir("qwen3")
    text = family_text_side("qwen3")
    server = start_vllm(model_dir, free_port(), model_name="qwen3", logprobs_mode="processed_logprobs",
                        serve_options=["--quick-start"], startup_timeout_s=900,
                        env={"VLLM_SERVER_DEV_MODE": "1"},  # the weight-update endpoints, for the scatter check
                        vllm_args=["--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                   "--reasoning-parser", "qwen3"])
    try:
        for messages in (CONVERSATION[:2], CONVERSATION):
            body = {"model": "qwen3", "messages": messages, "tools": [LOOKUP], "max_tokens": 1,
                    "return_token_ids": True}
            reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300.0)
            assert reply.status_code == 200, reply.text
            vllm_ids = reply.json()["prompt_token_ids"]
            ours = text.render_chat(messages, [LOOKUP], prefix_mode="retokenize", prior=[])
            assert np.asarray(ours.prompt_ids).tolist() == vllm_ids
        check = scatter_then_full(server, model_dir, tmp_path)
        print(f"qwen3 scatter: {check.delta_bytes} of {check.full_bytes} B, worker {check.worker}; "
              f"scatter vs full load: max logprob gap {check.gap:.2e}")
        assert check.gap <= 1e-5 and check.moved
        assert check.delta_bytes < 0.15 * check.full_bytes
    finally:
        server.stop()


def test_a_moe_family_on_the_cpu_build_is_not_reloaded_in_place_and_keeps_its_weights(vllm_installed: None,
                                                                                      tmp_path: Path) -> None:
    model_dir = family_dir("qwen3-coder")
    server = start_vllm(model_dir, free_port(), model_name="qwen3-coder", logprobs_mode="processed_logprobs",
                        serve_options=["--quick-start"], startup_timeout_s=900, env={"VLLM_SERVER_DEV_MODE": "1"},
                        vllm_args=[])
    store = PolicyStore(tmp_path / "store")
    store.publish(1, perturbed(load_file(str(model_dir / "model.safetensors")), seed=31), delta=True)
    logs: list[str] = []

    async def scenario() -> tuple[Any, Any, Any, int | None]:
        sync = WeightSync([server.url], store, base_dir=model_dir, transfer="scatter", log=logs.append)
        async with httpx.AsyncClient() as client:
            try:
                before = await answers(client, server)
                report = await sync.sync_to(1)
                after = await answers(client, server)
                return report, before, after, await sync.version_of(server.url)
            finally:
                await sync.close()

    try:
        report, before, after, label = asyncio.run(scenario())
    finally:
        server.stop()
    assert not report.ok and "prepacks the experts" in report.failed[server.url], (report, logs)
    assert max_gap(before, after) == 0.0 and label == 0  # its weights and its label as they were
