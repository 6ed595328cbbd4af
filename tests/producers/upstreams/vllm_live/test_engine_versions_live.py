"""Token-in through vLLM's ``/inference/v1/generate`` (``token_endpoint="generate"``) on the real server:
the same ids and logprobs as ``/v1/completions`` for the same seeded request, plus vLLM's own report of
which weights sampled the tokens; and a request that an update lands in the middle of (pause mode
``keep``: the request is frozen, not finished, while the weights change) comes back with two spans, the
tokens before the update at the old version and those after at the new one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors.torch import load_file

from models.policy_store import PolicyStore
from producers.upstreams.base import GenerateRequest, GenerateResult, Sampling, TokenChunk
from producers.upstreams.vllm import VLLMUpstream, label_version, spans_from_text
from trainer_consumer.weight_sync import VLLMAdmin

from .test_weight_sync_live import perturbed, restore_base
from .vllm_server import VLLMServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

PROMPT = [5, 17, 33, 41, 12, 9, 100, 200]


def upstream(server: VLLMServer, endpoint: str) -> VLLMUpstream:
    return VLLMUpstream([server.url], model=server.model_name, logprobs_mode=server.logprobs_mode,
                        token_endpoint=endpoint)  # type: ignore[arg-type]


class LongAnswers(VLLMUpstream):
    """The reference model ends its answers with EOS within about 30 tokens, faster than an update lands;
    ``ignore_eos`` keeps the request running (the ids, logprobs and spans are read as always)."""

    async def token_body(self, request: GenerateRequest, stream: bool) -> tuple[dict[str, Any], bytes]:
        body, sent = await super().token_body(request, stream)
        body["sampling_params"]["ignore_eos"] = True
        return body, sent


def request(request_id: str, max_tokens: int, temperature: float = 1.0) -> GenerateRequest:
    return GenerateRequest(prompt_ids=PROMPT, request_id=request_id, rollout_id="engine-versions",
                           sampling=Sampling(max_tokens=max_tokens, temperature=temperature, top_k=20, seed=7))


def test_generate_endpoint_samples_like_completions_and_reports_the_weights(vllm_server: VLLMServer) -> None:
    async def run() -> tuple[GenerateResult, GenerateResult, GenerateResult]:
        completions, generate = upstream(vllm_server, "completions"), upstream(vllm_server, "generate")
        try:
            plain = await completions.generate(request("ev-completions", 12))
            whole = await generate.generate(request("ev-generate", 12))
            items = [item async for item in generate.generate_stream(request("ev-generate-stream", 12))]
        finally:
            await completions.close()
            await generate.close()
        assert all(isinstance(i, TokenChunk) for i in items[:-1]) and len(items) > 2  # really streamed
        assert isinstance(items[-1], GenerateResult)
        return plain, whole, items[-1]

    plain, whole, streamed = asyncio.run(run())
    label = httpx.get(f"{vllm_server.url}/weight_info", timeout=10).json()["weight_version"]
    for result in (whole, streamed):
        assert (result.output_ids, result.output_logprobs) == (plain.output_ids, plain.output_logprobs)
        assert result.extra["weight_versions"] == f"{label}:0-{len(plain.output_ids)}"
        assert result.policy_version == label_version(label)
        assert result.version_spans == ()  # one version: the record's policy_version says it all
    assert "weight_versions" not in plain.extra  # /v1/completions reports no version


def test_an_update_landing_mid_request_gives_the_request_two_spans(
    vllm_server: VLLMServer, live_model_dir: Path, tmp_path: Path,
) -> None:
    store = PolicyStore(tmp_path / "policies")
    store.publish(1, perturbed(load_file(str(live_model_dir / "model.safetensors")), seed=4))

    async def run() -> GenerateResult:
        generate = LongAnswers([vllm_server.url], model=vllm_server.model_name,
                               logprobs_mode=vllm_server.logprobs_mode, token_endpoint="generate")
        first_token = asyncio.Event()

        async def consume() -> GenerateResult:
            # 1,500 tokens: long enough that the pause lands mid-request even on a loaded machine (300 tokens
            # once ended in 1.2 s, before it).
            async for item in generate.generate_stream(request("ev-span", 1500, temperature=0.0)):
                if isinstance(item, TokenChunk):
                    first_token.set()
                else:
                    return item
            raise AssertionError("the stream ended without a result")

        async with httpx.AsyncClient() as client:
            admin = VLLMAdmin(vllm_server.url, client, 120.0)
            try:
                consumer = asyncio.create_task(consume())
                await asyncio.wait_for(first_token.wait(), 120)
                await admin.pause("keep")  # the running request is frozen with its tokens so far
                await admin.reload_weights(str(store.info(1).path))
                await admin.reset_prefix_cache()
                await admin.set_weight_label("1")
                await admin.resume()
                return await asyncio.wait_for(consumer, 300)
            finally:
                await generate.close()

    try:
        before = label_version(httpx.get(f"{vllm_server.url}/weight_info", timeout=10).json()["weight_version"])
        result = asyncio.run(run())
        spans = spans_from_text(str(result.extra["weight_versions"]))
        assert [label_version(s.version) for s in spans] == [before, 1], spans
        assert spans[0].start == 0 and spans[0].end == spans[1].start and spans[1].end == len(result.output_ids)
        assert result.policy_version == before  # a call records the version of its first token
        # ... and the spans, typed, for its record's version_spans (per-token staleness downstream).
        assert [(s.version, s.start, s.end) for s in result.version_spans] == [
            (before, 0, spans[0].end), (1, spans[1].start, spans[1].end)]
    finally:
        restore_base(vllm_server, live_model_dir, store)
