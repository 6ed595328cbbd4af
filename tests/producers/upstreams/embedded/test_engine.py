"""The embedded reference engine against the real model: seeded determinism, logprobs that equal a
fresh forward pass, stop/length behaviour, streaming, batching, validation and policy hot-swap."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from models.policy_store import PolicyStore
from models.reference.task import LOOKUP_TOOL, task_messages
from producers.rendering import ChatRenderer
from producers.upstreams.base import GenerateRequest, GenerateResult, Sampling, TokenChunk, UpstreamError
from producers.upstreams.embedded.engine import EmbeddedEngine
from schemas.tokens import TokenIds


@pytest.fixture(scope="module")
def prompt(renderer: ChatRenderer) -> list[int]:
    return renderer.render(task_messages("fox"), [LOOKUP_TOOL])


@pytest.fixture(scope="module")
def noise() -> list[int]:
    """A prompt of arbitrary ids: off the warm-up distribution, so the next-token distributions are broad
    (the task prompt's are nearly one-hot, which would make sampling tests vacuous)."""
    rng = np.random.default_rng(0)
    return [1, *(int(i) for i in rng.integers(3, 500, size=40))]


@pytest.fixture(scope="module")
def reference_model(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


@pytest.fixture
def engine(model_dir: Path) -> Iterator[EmbeddedEngine]:
    engine = EmbeddedEngine(model_dir)
    yield engine
    asyncio.run(engine.close())


def _request(prompt: TokenIds, request_id: str = "r", **sampling: object) -> GenerateRequest:
    return GenerateRequest(prompt, Sampling(**sampling), request_id)  # type: ignore[arg-type]


def _run(engine: EmbeddedEngine, *requests: GenerateRequest) -> list[GenerateResult]:
    async def main() -> list[GenerateResult]:
        return list(await asyncio.gather(*(engine.generate(r) for r in requests)))

    return asyncio.run(main())


def _full_forward_logits(model: torch.nn.Module, prompt: list[int], output: list[int]) -> torch.Tensor:
    """Logits predicting each output token, from one forward pass over prompt ‖ output (no cache)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0]
    return logits[len(prompt) - 1: len(prompt) - 1 + len(output)].double()


def _reference_processed(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Independent numpy reference of temperature -> top-k -> top-p (nucleus over the top-k renormalised)."""
    out = []
    for row in logits.numpy():
        z = row / temperature
        order = np.argsort(-z, kind="stable")
        keep = np.zeros_like(z, dtype=bool)
        kept = order[:top_k] if top_k else order
        p = np.exp(z[kept] - z[kept].max())
        p /= p.sum()
        mass = 0.0
        for idx, prob in zip(kept, p, strict=True):
            keep[idx] = True
            mass += prob
            if mass >= top_p:
                break
        masked = np.where(keep, z, -np.inf)
        out.append(masked - np.log(np.exp(masked[keep] - masked[keep].max()).sum()) - masked[keep].max())
    return torch.tensor(np.array(out))


def test_same_seed_same_output_and_different_seed_differs(engine: EmbeddedEngine, noise: list[int]) -> None:
    a, b, c = _run(engine, *(_request(noise, f"r{i}", seed=s, max_tokens=24, temperature=1.5)
                             for i, s in enumerate([7, 7, 8])))
    assert a.output_ids == b.output_ids and a.output_logprobs == b.output_logprobs
    d, = _run(engine, _request(noise, seed=7, max_tokens=24, temperature=1.5))  # alone, in a later batch
    assert d.output_ids == a.output_ids
    assert np.allclose(d.output_logprobs, a.output_logprobs, atol=1e-5)
    assert c.output_ids != a.output_ids
    assert a.prompt_ids == noise and a.policy_version == 0 and a.logprob_kind == "PROCESSED"
    assert a.extra["seed"] == 7 and a.engine.startswith("embedded/")
    unseeded = _run(engine, _request(noise, "u1", max_tokens=4), _request(noise, "u2", max_tokens=4))
    assert unseeded[0].extra["seed"] != unseeded[1].extra["seed"]  # recorded, so replayable


def test_raw_logprobs_equal_a_fresh_forward_pass(model_dir: Path, noise: list[int],
                                                 reference_model: torch.nn.Module) -> None:
    engine = EmbeddedEngine(model_dir, logprob_kind="RAW")
    try:
        result, = _run(engine, _request(noise, seed=3, max_tokens=32, temperature=1.7, top_k=50))
    finally:
        asyncio.run(engine.close())
    assert result.logprob_kind == "RAW"
    logits = _full_forward_logits(reference_model, noise, result.output_ids)
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(result.output_ids)[:, None])[:, 0]
    assert np.allclose(result.output_logprobs, expected.numpy(), atol=1e-4)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (1.8, 20, 0.9), (2.5, 0, 0.5)])
def test_processed_logprobs_are_of_the_distribution_sampled_from(
        engine: EmbeddedEngine, noise: list[int], reference_model: torch.nn.Module,
        temperature: float, top_k: int, top_p: float) -> None:
    result, = _run(engine, _request(noise, seed=11, max_tokens=32, temperature=temperature,
                                    top_k=top_k, top_p=top_p))
    logits = _full_forward_logits(reference_model, noise, result.output_ids)
    reference = _reference_processed(logits, temperature, top_k, top_p)
    expected = reference.gather(-1, torch.tensor(result.output_ids)[:, None])[:, 0].numpy()
    assert np.isfinite(expected).all()  # every sampled token was inside the kept set
    assert np.allclose(result.output_logprobs, expected, atol=1e-4)


def test_greedy_is_argmax(engine: EmbeddedEngine, noise: list[int], reference_model: torch.nn.Module) -> None:
    result, = _run(engine, _request(noise, temperature=0.0, max_tokens=16))
    logits = _full_forward_logits(reference_model, noise, result.output_ids)
    assert result.output_ids == logits.argmax(-1).tolist()


def test_stop_token_is_included_and_length_cuts(engine: EmbeddedEngine, prompt: list[int]) -> None:
    results = _run(engine, *(_request(prompt, f"s{i}", seed=i, max_tokens=64) for i in range(6)))
    stopped = [r for r in results if r.finish_reason == "stop"]
    assert stopped, "the model never emitted <|im_end|> in 64 tokens"
    for r in stopped:
        assert r.output_ids[-1] == 2 and 2 not in r.output_ids[:-1]
    short, = _run(engine, _request(prompt, seed=1, max_tokens=3, stop_token_ids=()))
    assert short.finish_reason == "length" and len(short.output_ids) == 3 and len(short.output_logprobs) == 3
    first = results[0].output_ids[0]
    custom, = _run(engine, _request(prompt, seed=0, max_tokens=64, stop_token_ids=(first,)))
    assert custom.output_ids == [first] and custom.finish_reason == "stop"


def test_stream_yields_each_token_then_the_result(engine: EmbeddedEngine, noise: list[int]) -> None:
    async def collect() -> list[TokenChunk | GenerateResult]:
        request = _request(noise, seed=5, max_tokens=20, temperature=1.5)
        return [item async for item in engine.generate_stream(request)]

    items = asyncio.run(collect())
    *chunks, final = items
    assert isinstance(final, GenerateResult) and all(isinstance(c, TokenChunk) for c in chunks)
    assert [i for c in chunks for i in c.ids] == final.output_ids  # type: ignore[union-attr]
    assert [x for c in chunks for x in c.logprobs] == final.output_logprobs  # type: ignore[union-attr]
    assert all(len(c.ids) == 1 for c in chunks)  # type: ignore[union-attr]
    plain, = _run(engine, _request(noise, seed=5, max_tokens=20, temperature=1.5))
    assert plain.output_ids == final.output_ids


def test_concurrent_requests_are_batched_and_match_solo_runs(engine: EmbeddedEngine, prompt: list[int],
                                                            noise: list[int]) -> None:
    # different lengths (left padding), peaked and broad distributions
    requests = [_request(prompt if i % 2 else noise[: 20 + i], f"b{i}", seed=100 + i, max_tokens=12,
                         temperature=1.5) for i in range(6)]
    together = _run(engine, *requests)
    assert max(int(r.extra["batch_size"]) for r in together) > 1  # type: ignore[call-overload]
    for request, batched in zip(requests, together, strict=True):
        solo, = _run(engine, request)
        assert solo.output_ids == batched.output_ids
        assert np.allclose(solo.output_logprobs, batched.output_logprobs, atol=1e-4)


def test_bad_requests_are_refused_with_400(engine: EmbeddedEngine, prompt: list[int]) -> None:
    for request, text in [
        (_request([], max_tokens=4), "empty"),
        (_request([1, 5, 100000], max_tokens=4), "Token id 100000 is out of vocabulary"),
        (_request(np.array([1, 100001, 5], dtype=np.uint32), max_tokens=4), "Token id 100001 is out"),
        (_request(np.zeros(0, dtype=np.uint32), max_tokens=4), "empty"),
        (_request([1, 2.5], max_tokens=4), "Token id 2.5 is out of vocabulary"),
        (_request(prompt, max_tokens=10**6), "maximum context length"),
        (_request(prompt, max_tokens=0), "max_tokens"),
        (_request(prompt, top_p=0.0), "top_p"),
    ]:
        with pytest.raises(UpstreamError, match=text) as info:
            _run(engine, request)
        assert info.value.status_code == 400
    ok, = _run(engine, _request(prompt, max_tokens=2))  # the engine survives them
    assert len(ok.output_ids) >= 1


def test_policy_load_changes_outputs_and_version(engine: EmbeddedEngine, noise: list[int], tmp_path: Path,
                                                 reference_model: torch.nn.Module) -> None:
    prompt = noise
    before, = _run(engine, _request(prompt, seed=21, max_tokens=16))
    store = PolicyStore(tmp_path / "policies")
    state = {k: v.clone() for k, v in reference_model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    state["lm_head.weight"] += torch.randn(state["lm_head.weight"].shape, generator=generator) * 0.5
    info = store.publish(3, state, {"step": 1})

    async def swap() -> tuple[bool, int, bool]:
        loaded = await engine.refresh_policy(store)
        version = await engine.policy_version()
        again = await engine.refresh_policy(store)  # already current: nothing to do
        return loaded, version, again

    assert asyncio.run(swap()) == (True, 3, False)
    after, = _run(engine, _request(prompt, seed=21, max_tokens=16))
    assert after.policy_version == 3 and before.policy_version == 0
    assert after.output_logprobs[0] != pytest.approx(before.output_logprobs[0], abs=1e-4) or (
        after.output_ids != before.output_ids)
    # the new logprobs are those of the published weights
    reference_model.load_state_dict(store.load_state_dict(3))
    logits = _full_forward_logits(reference_model, prompt, after.output_ids)
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(after.output_ids)[:, None])[:, 0]
    assert np.allclose(after.output_logprobs, expected.numpy(), atol=1e-4)
    reference_model.load_state_dict(state)  # keep the module fixture consistent for later tests
    assert info.path == store.path(3)


def test_a_policy_that_does_not_fit_is_refused(engine: EmbeddedEngine, tmp_path: Path, prompt: list[int]) -> None:
    store = PolicyStore(tmp_path)
    store.publish(1, {"not.a.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="does not fit"):
        asyncio.run(engine.load_policy(1, store.path(1)))
    assert asyncio.run(engine.policy_version()) == 0
    ok, = _run(engine, _request(prompt, max_tokens=2))
    assert ok.policy_version == 0


def test_follow_policies_picks_up_new_versions(engine: EmbeddedEngine, tmp_path: Path,
                                               reference_model: torch.nn.Module) -> None:
    store = PolicyStore(tmp_path)

    async def main() -> int:
        engine.follow_policies(store, interval_s=0.05)
        await asyncio.sleep(0.1)
        store.publish(5, reference_model.state_dict())
        for _ in range(100):
            if await engine.policy_version() == 5:
                break
            await asyncio.sleep(0.05)
        version = await engine.policy_version()
        await engine.close()
        return version

    assert asyncio.run(main()) == 5


def test_closed_engine_refuses(model_dir: Path, prompt: list[int]) -> None:
    engine = EmbeddedEngine(model_dir)
    asyncio.run(engine.close())
    with pytest.raises(UpstreamError) as info:
        _run(engine, _request(prompt, max_tokens=2))
    assert info.value.status_code == 503
