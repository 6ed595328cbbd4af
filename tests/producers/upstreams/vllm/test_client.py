"""VLLMUpstream against real vLLM 0.32 answers (replayed by a local HTTP server)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections import Counter
from typing import Any

import numpy as np
import orjson
import pytest

from producers.upstreams.base import GenerateRequest, GenerateResult, Sampling, TokenChunk, UpstreamError
from producers.upstreams.vllm import (
    ChatPassthrough,
    VLLMError,
    VLLMUpstream,
    rendezvous_order,
)
from producers.upstreams.vllm.answers import check_prompt, sse_json
from schemas.tokens import int_list

from .fake_vllm_server import FakeVLLM

Fixtures = dict[str, dict[str, Any]]


def _d_request(fixtures: Fixtures, rollout_id: str = "rollout-1", **overrides: Any) -> GenerateRequest:
    body = fixtures["d_completions_token_ids"]["request"]["body"]
    sampling = Sampling(temperature=body["temperature"], max_tokens=body["max_tokens"], seed=body["seed"])
    prompt = overrides.pop("prompt_ids", body["prompt"])
    if overrides:
        sampling = Sampling(**{**sampling.__dict__, **overrides})
    return GenerateRequest(
        prompt_ids=list(prompt), sampling=sampling, request_id="req-1", rollout_id=rollout_id
    )


async def _collect_stream(
    upstream: VLLMUpstream, request: GenerateRequest
) -> tuple[list[TokenChunk], GenerateResult]:
    chunks: list[TokenChunk] = []
    final: GenerateResult | None = None
    async for item in upstream.generate_stream(request):
        if isinstance(item, TokenChunk):
            assert final is None, "token chunks come before the result"
            chunks.append(item)
        else:
            final = item
    assert final is not None
    return chunks, final


def test_token_in_completion_parses_ids_and_logprobs(fake_vllm: FakeVLLM, vllm_fixtures: Fixtures) -> None:
    recorded = vllm_fixtures["d_completions_token_ids"]["response"]["body"]["choices"][0]

    async def run() -> GenerateResult:
        upstream = VLLMUpstream(fake_vllm.url)
        try:
            return await upstream.generate(_d_request(vllm_fixtures))
        finally:
            await upstream.close()

    result = asyncio.run(run())
    assert result.prompt_ids == recorded["prompt_token_ids"]
    assert result.output_ids == recorded["token_ids"]
    assert len(result.output_ids) == 24
    assert result.output_logprobs == recorded["logprobs"]["token_logprobs"]
    assert result.finish_reason == "length"
    assert result.logprob_kind == "RAW"
    assert result.engine == "vllm/0.32.0"
    assert result.upstream == fake_vllm.url
    assert result.extra["system_fingerprint"] == "vllm-0.32.0-f2e616c5"

    sent = next(r for r in fake_vllm.received if r["path"] == "/v1/completions")["body"]
    assert sent["prompt"] == recorded["prompt_token_ids"]
    assert sent["model"] == "tiny"  # discovered through /v1/models
    assert sent["return_token_ids"] is True and sent["logprobs"] == 1
    assert sent["skip_special_tokens"] is False
    assert (sent["seed"], sent["max_tokens"], sent["temperature"]) == (7, 24, 1.0)
    assert "top_k" not in sent and "stream" not in sent  # top_k 0 means "disabled": not sent
    assert fake_vllm.paths().count("/v1/models") == 1 and fake_vllm.paths().count("/version") == 1


def test_the_gateways_uint32_prompt_array_is_sent_and_checked_like_a_list(
        fake_vllm: FakeVLLM, vllm_fixtures: Fixtures) -> None:
    """The gateway hands upstreams its read-only uint32 array; the JSON vLLM gets is the same (the
    replaying server answers only a body it recorded), and the prompt check compares ids, not types."""
    as_list = _d_request(vllm_fixtures)
    as_array = dataclasses.replace(as_list, prompt_ids=np.asarray(as_list.prompt_ids, dtype=np.uint32))

    async def run() -> tuple[GenerateResult, GenerateResult]:
        upstream = VLLMUpstream(fake_vllm.url)
        try:
            return await upstream.generate(as_list), await upstream.generate(as_array)
        finally:
            await upstream.close()

    from_list, from_array = asyncio.run(run())
    # What ran was checked equal to what was sent, so the result carries the sent ids as they were given.
    assert from_array.prompt_ids is as_array.prompt_ids and from_list.prompt_ids is as_list.prompt_ids
    assert int_list(from_array.prompt_ids) == int_list(from_list.prompt_ids) == list(as_list.prompt_ids)
    assert from_array.output_ids == from_list.output_ids and len(from_array.output_ids) == 24
    wrong = dataclasses.replace(as_array, prompt_ids=as_array.prompt_ids[::-1].copy())
    with pytest.raises(UpstreamError, match="differ from the"):
        check_prompt(wrong, orjson.dumps(wrong.prompt_ids, option=orjson.OPT_SERIALIZE_NUMPY),
                     list(as_list.prompt_ids), "server")


def test_streaming_equals_non_streaming(fake_vllm: FakeVLLM, vllm_fixtures: Fixtures) -> None:
    async def run() -> tuple[GenerateResult, list[TokenChunk], GenerateResult]:
        upstream = VLLMUpstream(fake_vllm.url, model="tiny")
        try:
            whole = await upstream.generate(_d_request(vllm_fixtures))
            chunks, final = await _collect_stream(upstream, _d_request(vllm_fixtures))
            return whole, chunks, final
        finally:
            await upstream.close()

    whole, chunks, final = asyncio.run(run())
    assert len(chunks) == 24 and all(len(c.ids) == 1 == len(c.logprobs) for c in chunks)
    assert [i for c in chunks for i in c.ids] == final.output_ids == whole.output_ids
    assert [v for c in chunks for v in c.logprobs] == final.output_logprobs == whole.output_logprobs
    assert final.prompt_ids == whole.prompt_ids
    assert final.finish_reason == whole.finish_reason == "length"
    assert final.first_token_ms > 0 and final.total_ms >= final.first_token_ms
    sent = [r for r in fake_vllm.received if r["path"] == "/v1/completions"][-1]["body"]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_processed_logprobs_mode_is_recorded_and_logits_modes_refused(
    fake_vllm: FakeVLLM, vllm_fixtures: Fixtures
) -> None:
    async def run() -> GenerateResult:
        upstream = VLLMUpstream(fake_vllm.url, logprobs_mode="processed_logprobs")
        try:
            return await upstream.generate(_d_request(vllm_fixtures))
        finally:
            await upstream.close()

    assert asyncio.run(run()).logprob_kind == "PROCESSED"
    with pytest.raises(ValueError, match="logits"):
        VLLMUpstream(fake_vllm.url, logprobs_mode="raw_logits")


@pytest.mark.parametrize("stream", [False, True])
def test_client_errors_map_to_upstream_errors(
    fake_vllm: FakeVLLM, vllm_fixtures: Fixtures, stream: bool
) -> None:
    async def attempt(request: GenerateRequest) -> VLLMError:
        upstream = VLLMUpstream(fake_vllm.url, model="tiny")
        try:
            with pytest.raises(VLLMError) as caught:
                if stream:
                    await _collect_stream(upstream, request)
                else:
                    await upstream.generate(request)
            return caught.value
        finally:
            await upstream.close()

    too_long = asyncio.run(attempt(_d_request(vllm_fixtures, max_tokens=4096, seed=None)))
    assert too_long.status_code == 400
    assert too_long.error_type == "invalid_request_error"
    assert too_long.vllm_type == "BadRequestError" and too_long.param == "max_tokens"
    assert "cannot be greater than max_model_len=2048" in str(too_long)
    assert isinstance(too_long, UpstreamError)

    out_of_vocab = _d_request(vllm_fixtures, prompt_ids=[1, 85, 100000], max_tokens=4, seed=None)
    unknown_id = asyncio.run(attempt(out_of_vocab))
    assert unknown_id.status_code == 400
    assert "Token id 100000 is out of vocabulary" in str(unknown_id)


def test_models_version_and_unknown_model(fake_vllm: FakeVLLM, vllm_fixtures: Fixtures) -> None:
    body = vllm_fixtures["g_error_unknown_model"]["request"]["body"]

    async def run() -> tuple[list[dict[str, Any]], str, VLLMError]:
        upstream = VLLMUpstream(fake_vllm.url)
        try:
            models = await upstream.models()
            engine = await upstream.engine()
            with pytest.raises(VLLMError) as caught:
                await upstream.chat_passthrough(body, rollout_id="r")
            return models, engine, caught.value
        finally:
            await upstream.close()

    models, engine, error = asyncio.run(run())
    assert [m["id"] for m in models] == ["tiny"] and models[0]["max_model_len"] == 2048
    assert engine == "vllm/0.32.0"
    assert (error.status_code, error.error_type, error.param) == (404, "not_found_error", "model")


def test_chat_passthrough_returns_engine_token_ids(fake_vllm: FakeVLLM, vllm_fixtures: Fixtures) -> None:
    recorded = vllm_fixtures["a_chat_logprobs_token_ids"]
    request = dict(recorded["request"]["body"])
    # The harness asked for neither; the pass-through adds them.
    request.pop("return_token_ids")
    request.pop("logprobs")
    stream_request = dict(vllm_fixtures["b_chat_logprobs_token_ids_stream"]["request"]["body"])

    async def run() -> tuple[ChatPassthrough, ChatPassthrough, int]:
        upstream = VLLMUpstream(fake_vllm.url)
        try:
            whole = await upstream.chat_passthrough(request, rollout_id="r")
            streamed: ChatPassthrough | None = None
            forwarded = 0
            async for item in upstream.chat_passthrough_stream(stream_request, rollout_id="r"):
                if isinstance(item, ChatPassthrough):
                    streamed = item
                else:
                    forwarded += 1
            assert streamed is not None
            return whole, streamed, forwarded
        finally:
            await upstream.close()

    whole, streamed, forwarded = asyncio.run(run())
    body = recorded["response"]["body"]
    assert whole.prompt_token_ids == body["prompt_token_ids"] and len(whole.prompt_token_ids) == 48
    assert whole.choices[0].token_ids == body["choices"][0]["token_ids"]
    assert whole.choices[0].logprobs == [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    assert whole.response["choices"][0]["message"]["content"] == body["choices"][0]["message"]["content"]
    sent = next(r for r in fake_vllm.received if r["path"] == "/v1/chat/completions")["body"]
    assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["top_logprobs"] == 2
    # Streaming == non-streaming (the recorded server's own check, seen through the client).
    assert streamed.prompt_token_ids == whole.prompt_token_ids
    assert streamed.choices[0].token_ids == whole.choices[0].token_ids
    assert streamed.choices[0].logprobs == whole.choices[0].logprobs
    assert streamed.choices[0].finish_reason == whole.choices[0].finish_reason
    recorded_events = vllm_fixtures["b_chat_logprobs_token_ids_stream"]["response"]["events"]
    assert forwarded == len(streamed.chunks) == len(recorded_events) - 1  # all but [DONE]


def test_rollouts_stick_to_one_server(fake_vllm_fleet: list[FakeVLLM], vllm_fixtures: Fixtures) -> None:
    urls = [s.url for s in fake_vllm_fleet]
    rollouts = [f"rollout-{i}" for i in range(24)]

    async def run() -> dict[str, set[str]]:
        upstream = VLLMUpstream(urls, model="tiny")
        served: dict[str, set[str]] = {r: set() for r in rollouts}
        try:
            for _ in range(2):
                calls = [upstream.generate(_d_request(vllm_fixtures, r)) for r in rollouts]
                results = await asyncio.gather(*calls)
                for rollout, result in zip(rollouts, results, strict=True):
                    served[rollout].add(result.upstream)
                    assert result.upstream == upstream.server_for(rollout)
        finally:
            await upstream.close()
        return served

    served = asyncio.run(run())
    assert all(len(s) == 1 for s in served.values())
    load = Counter(next(iter(s)) for s in served.values())
    assert len(load) == 3, f"24 rollouts should spread over all 3 servers, got {load}"
    hits = Counter(url for s in fake_vllm_fleet for url in [s.url] * s.paths().count("/v1/completions"))
    assert sum(hits.values()) == 48 and hits == Counter({u: 2 * n for u, n in load.items()})


def test_rendezvous_moves_only_the_removed_servers_rollouts() -> None:
    servers = [f"http://vllm-{i}:8000" for i in range(5)]
    keys = [f"rollout-{i}" for i in range(2000)]
    before = {k: rendezvous_order(k, servers)[0] for k in keys}
    after = {k: rendezvous_order(k, servers[:4])[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == servers[4] for k in moved)
    assert 300 < Counter(before.values())[servers[0]] < 500  # about 2000 / 5


def test_unreachable_server_is_skipped(fake_vllm: FakeVLLM, vllm_fixtures: Fixtures) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # closed once the block ends: refuses connections
    servers = [dead, fake_vllm.url]
    rollout = next(f"r{i}" for i in range(100) if rendezvous_order(f"r{i}", servers)[0] == dead)

    async def run() -> GenerateResult:
        upstream = VLLMUpstream(servers, model="tiny")
        try:
            return await upstream.generate(_d_request(vllm_fixtures, rollout))
        finally:
            await upstream.close()

    assert asyncio.run(run()).upstream == fake_vllm.url

    async def all_dead() -> None:
        upstream = VLLMUpstream([dead], model="tiny")
        try:
            await upstream.generate(_d_request(vllm_fixtures, rollout))
        finally:
            await upstream.close()

    with pytest.raises(UpstreamError) as caught:
        asyncio.run(all_dead())
    assert caught.value.status_code == 502 and caught.value.error_type == "upstream_unavailable"


def test_weight_updates_call_vllm_endpoints_in_order(fake_vllm_fleet: list[FakeVLLM]) -> None:
    urls = [s.url for s in fake_vllm_fleet[:2]]

    async def run() -> tuple[int, int, str]:
        upstream = VLLMUpstream(urls, model="tiny")
        try:
            await upstream.update_weights(3, weights_path="/ckpt/policy-3")
            after_reload = await upstream.policy_version()
            await upstream.update_weights(4, lora_name="policy", lora_path="/ckpt/lora-4")
            return after_reload, await upstream.policy_version(), await upstream.model()
        finally:
            await upstream.close()

    after_reload, after_lora, model = asyncio.run(run())
    assert (after_reload, after_lora, model) == (3, 4, "policy")
    for server in fake_vllm_fleet[:2]:
        assert server.paths() == [
            "/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume",
            "/v1/load_lora_adapter",
        ] + (["/v1/models"] if server is fake_vllm_fleet[0] else [])  # model(): the context, learnt once
        rpc, version, lora = (server.received[i]["body"] for i in (1, 3, 5))
        assert rpc == {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/policy-3"}}
        assert server.received[0]["query"] == "mode=wait"
        assert version == {"new_version": "3"}
        assert lora == {"lora_name": "policy", "lora_path": "/ckpt/lora-4", "load_inplace": True}
    assert fake_vllm_fleet[2].received == []
    with pytest.raises(ValueError):
        asyncio.run(VLLMUpstream(urls).update_weights(5))


class _Body:
    """An answer's body as the client hands it to the SSE parser, in pieces cut anywhere."""

    def __init__(self, body: bytes, piece: int = 7) -> None:
        self.pieces = [body[i:i + piece] for i in range(0, len(body), piece)]

    async def chunks(self) -> Any:
        for piece in self.pieces:
            yield piece


def _sse(body: bytes) -> _Body:
    return _Body(body)


def test_sse_parser_handles_errors_and_truncation() -> None:
    async def events(body: bytes) -> list[dict[str, Any]]:
        return [e async for e in sse_json(_sse(body), "s")]

    ok = b': comment\n\nevent: completion\ndata: {"choices": []}\n\ndata: [DONE]\n\n'
    assert asyncio.run(events(ok)) == [{"choices": []}]
    error = b'data: {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}\n\n'
    with pytest.raises(VLLMError) as caught:
        asyncio.run(events(error))
    assert caught.value.status_code == 502 and "engine died" in str(caught.value)
    with pytest.raises(UpstreamError, match="without \\[DONE\\]"):
        asyncio.run(events(b'data: {"choices": []}\n\n'))


def test_a_generation_nobody_reads_token_by_token_is_one_non_streamed_request(
        fake_vllm: FakeVLLM, vllm_fixtures: Fixtures) -> None:
    """run_generation without a text listener or stop strings asks for the whole answer: vLLM gets the
    recorded non-streamed request and the ids and logprobs are those of the streamed answer."""
    from producers.gateway.generation import run_generation

    async def run() -> tuple[Any, tuple[list[TokenChunk], GenerateResult]]:
        upstream = VLLMUpstream(fake_vllm.url, model="tiny")
        try:
            whole = await run_generation(upstream.generate_stream(_d_request(vllm_fixtures)), decode=str)
            return whole, await _collect_stream(upstream, _d_request(vllm_fixtures))
        finally:
            await upstream.close()

    whole, (chunks, streamed) = asyncio.run(run())
    completions = [r["body"] for r in fake_vllm.received if r["path"] == "/v1/completions"]
    assert [bool(body.get("stream")) for body in completions] == [False, True]
    assert whole.output_ids == streamed.output_ids == [i for c in chunks for i in c.ids]
    assert whole.output_logprobs == streamed.output_logprobs and len(whole.output_ids) == 24
    assert whole.finish_reason == streamed.finish_reason == "length"


def test_a_prompt_the_models_context_cannot_hold_is_refused_before_it_is_sent(
        fake_vllm: FakeVLLM, vllm_fixtures: Fixtures) -> None:
    """With a configured model the context (max_model_len 2048 in the recording) is still learnt on the
    first call, so the gateway can fit budgets into it; a longer prompt never reaches vLLM."""
    async def run() -> tuple[int | None, UpstreamError]:
        upstream = VLLMUpstream(fake_vllm.url, model="tiny")
        try:
            await upstream.generate(_d_request(vllm_fixtures))
            context = upstream.max_model_len
            with pytest.raises(UpstreamError) as caught:
                await upstream.generate(_d_request(vllm_fixtures, prompt_ids=[1] * 2048))
            return context, caught.value
        finally:
            await upstream.close()

    context, refused = asyncio.run(run())
    assert context == 2048
    assert refused.status_code == 400 and "context_length_exceeded" in str(refused)
    assert [r["path"] for r in fake_vllm.received].count("/v1/completions") == 1
