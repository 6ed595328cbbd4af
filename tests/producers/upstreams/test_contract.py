"""The ``Upstream`` contract, one test class run against both implementations: the embedded reference
engine and a vLLM server (VLLMUpstream against a real vLLM 0.32's recorded answers).

What the gateway relies on from any upstream: the prompt it ran is the prompt it was given, every
sampled id has its logprob, a stream's chunks add up to the result (and equal the unary answer for the
same seed), and a request it cannot serve is refused as a 400 ``UpstreamError``, not a crash.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from producers.upstreams.base import (
    GenerateRequest,
    GenerateResult,
    Sampling,
    TokenChunk,
    Upstream,
    UpstreamError,
)
from producers.upstreams.embedded.engine import EmbeddedEngine
from producers.upstreams.vllm import VLLMUpstream

from .vllm.fake_vllm_server import FakeVLLM, load_fixtures


@dataclass(frozen=True)
class Case:
    """One implementation: how to open it (inside the event loop that uses it) and what to ask it."""

    open: Callable[[], Upstream]
    request: GenerateRequest  # answerable, seeded, temperature 1
    too_long: GenerateRequest  # prompt + max_tokens beyond the model's context
    out_of_vocabulary: GenerateRequest


def _request(prompt: list[int], max_tokens: int, seed: int | None, request_id: str = "contract") -> GenerateRequest:
    return GenerateRequest(prompt, Sampling(temperature=1.0, max_tokens=max_tokens, seed=seed), request_id,
                           rollout_id="rollout-contract")


def _recorded_request() -> tuple[list[int], int, int]:
    body = load_fixtures()["d_completions_token_ids"]["request"]["body"]
    return list(body["prompt"]), int(body["max_tokens"]), int(body["seed"])


@pytest.fixture(scope="module")
def embedded_engine(model_dir: Path) -> Iterator[EmbeddedEngine]:
    engine = EmbeddedEngine(model_dir)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="module")
def recorded_vllm() -> Iterator[FakeVLLM]:
    server = FakeVLLM(load_fixtures()).start()
    yield server
    server.stop()


@pytest.fixture(params=["embedded", "vllm"])
def case(request: pytest.FixtureRequest) -> Case:
    prompt, max_tokens, seed = _recorded_request()
    if request.param == "embedded":
        engine: EmbeddedEngine = request.getfixturevalue("embedded_engine")
        prompt = [i % engine.vocab_size for i in prompt]
        return Case(lambda: _Borrowed(engine), _request(prompt, max_tokens, seed),
                    _request(prompt, engine.max_model_len, None), _request([1, 85, 100000], 4, None))
    server: FakeVLLM = request.getfixturevalue("recorded_vllm")
    # The recorded refusals are of these exact requests (vLLM's max_model_len there is 2048).
    return Case(lambda: VLLMUpstream(server.url, model="tiny"), _request(prompt, max_tokens, seed),
                _request(prompt, 4096, None), _request([1, 85, 100000], 4, None))


class _Borrowed:
    """The module's engine, lent to one test: closing it is the fixture's job."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def close(self) -> None:
        return None


def _with(case: Case, use: Callable[[Upstream], Any]) -> Any:
    async def run() -> Any:
        upstream = case.open()
        try:
            return await use(upstream)
        finally:
            await upstream.close()

    return asyncio.run(run())


async def _stream(upstream: Upstream, request: GenerateRequest) -> tuple[list[TokenChunk], list[GenerateResult]]:
    chunks: list[TokenChunk] = []
    results: list[GenerateResult] = []
    async for item in upstream.generate_stream(request):
        if isinstance(item, TokenChunk):
            assert not results, "a token chunk came after the result"
            chunks.append(item)
        else:
            results.append(item)
    return chunks, results


class TestUpstreamContract:
    def test_the_result_is_token_exact(self, case: Case) -> None:
        result: GenerateResult = _with(case, lambda u: u.generate(case.request))
        assert list(result.prompt_ids) == list(case.request.prompt_ids)
        assert 0 < len(result.output_ids) <= case.request.sampling.max_tokens
        assert len(result.output_logprobs) == len(result.output_ids)
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in result.output_logprobs)
        assert result.finish_reason in ("stop", "length")
        assert result.finish_reason == "stop" or len(result.output_ids) == case.request.sampling.max_tokens
        assert result.logprob_kind in ("RAW", "PROCESSED")
        assert result.engine and result.upstream
        assert isinstance(result.policy_version, int) and result.policy_version >= 0

    def test_a_stream_adds_up_to_its_result_and_equals_the_unary_answer(self, case: Case) -> None:
        async def both(upstream: Upstream) -> tuple[GenerateResult, list[TokenChunk], list[GenerateResult]]:
            whole = await upstream.generate(case.request)
            chunks, results = await _stream(upstream, case.request)
            return whole, chunks, results

        whole, chunks, results = _with(case, both)
        assert len(results) == 1, "a stream ends with exactly one result"
        final = results[0]
        assert chunks and all(len(c.ids) == len(c.logprobs) for c in chunks)
        assert [i for c in chunks for i in c.ids] == final.output_ids == whole.output_ids
        assert [v for c in chunks for v in c.logprobs] == pytest.approx(final.output_logprobs)
        assert final.output_logprobs == pytest.approx(whole.output_logprobs)
        assert list(final.prompt_ids) == list(whole.prompt_ids)
        assert final.finish_reason == whole.finish_reason

    @pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
    @pytest.mark.parametrize("which", ["too_long", "out_of_vocabulary"])
    def test_an_unservable_request_is_refused_with_400_and_the_next_one_served(
            self, case: Case, which: str, stream: bool) -> None:
        bad: GenerateRequest = getattr(case, which)

        async def refuse_then_serve(upstream: Upstream) -> GenerateResult:
            with pytest.raises(UpstreamError) as refused:
                if stream:
                    await _stream(upstream, bad)
                else:
                    await upstream.generate(bad)
            assert refused.value.status_code == 400, refused.value
            assert ("vocabulary" if which == "out_of_vocabulary" else "max") in str(refused.value).lower()
            return await upstream.generate(case.request)

        after = _with(case, refuse_then_serve)
        assert len(after.output_ids) > 0

    def test_the_policy_version_is_a_number(self, case: Case) -> None:
        version = _with(case, lambda u: u.policy_version())
        assert isinstance(version, int) and version >= 0
