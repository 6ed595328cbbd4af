"""Several policy versions served at once by the real embedded engine: each request gets the version it
names (its logprobs are that version's), a mixed batch equals solo runs, residency is a bounded LRU that
never drops a served version, and a version that cannot be had is refused without harming the rest."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from models.policy_store import PolicyStore
from producers.upstreams.base import GenerateRequest, GenerateResult, Sampling, UpstreamError
from producers.upstreams.embedded.engine import EmbeddedEngine
from producers.upstreams.embedded.versions import ResidentVersions

NOISE = [1, *(int(i) for i in np.random.default_rng(0).integers(3, 500, size=40))]


@pytest.fixture(scope="module")
def base_state(model_dir: Path) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, base_state: dict[str, torch.Tensor]) -> PolicyStore:
    """Versions 1 and 2: the base weights with differently perturbed output heads."""
    store = PolicyStore(tmp_path_factory.mktemp("policies"))
    for version in (1, 2):
        state = {k: v.clone() for k, v in base_state.items()}
        generator = torch.Generator().manual_seed(version)
        state["lm_head.weight"] += torch.randn(state["lm_head.weight"].shape, generator=generator) * 0.5
        store.publish(version, state)
    return store


@pytest.fixture
def engine(model_dir: Path) -> Iterator[EmbeddedEngine]:
    engine = EmbeddedEngine(model_dir, max_resident_versions=2)
    yield engine
    asyncio.run(engine.close())


def _request(version: int | None, request_id: str = "r") -> GenerateRequest:
    return GenerateRequest(NOISE, Sampling(seed=7, max_tokens=8), request_id, policy_version=version)


def _expected_logprobs(model_dir: Path, state: dict[str, torch.Tensor], output: list[int]) -> np.ndarray:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    model.load_state_dict(state)
    ids = torch.tensor([NOISE + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(NOISE) - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(output)[:, None])[:, 0].numpy()


def test_each_request_is_served_by_the_version_it_names(engine: EmbeddedEngine, store: PolicyStore,
                                                        model_dir: Path,
                                                        base_state: dict[str, torch.Tensor]) -> None:
    async def main() -> tuple[list[GenerateResult], list[GenerateResult]]:
        await engine.serve_versions({1, 2}, store)
        mixed = await asyncio.gather(*(engine.generate(_request(v, f"m{i}")) for i, v in enumerate([0, 1, 2, None])))
        solo = [await engine.generate(_request(v, f"s{v}")) for v in (0, 1, 2)]
        return list(mixed), solo

    mixed, solo = asyncio.run(main())
    assert [r.policy_version for r in mixed] == [0, 1, 2, 0]  # None: the default (newest followed: 0)
    for got, alone in zip(mixed[:3], solo, strict=True):  # batch mates of other versions change nothing
        assert got.output_ids == alone.output_ids and np.allclose(got.output_logprobs, alone.output_logprobs,
                                                                  atol=1e-5)
    assert mixed[1].output_ids != mixed[2].output_ids or not np.allclose(mixed[1].output_logprobs,
                                                                          mixed[2].output_logprobs, atol=1e-3)
    for result, state in ((mixed[0], base_state), (mixed[1], store.load_state_dict(1)),
                          (mixed[2], store.load_state_dict(2))):
        expected = _expected_logprobs(model_dir, state, result.output_ids)
        assert np.allclose(result.output_logprobs, expected, atol=1e-4), result.policy_version


def test_residency_is_bounded_and_keeps_served_versions(engine: EmbeddedEngine, store: PolicyStore) -> None:
    async def main() -> tuple[list[int], list[int], list[int], int]:
        await engine.serve_versions({1, 2}, store)
        all_served = engine.resident_versions()  # default 0 and both served: over the bound of 2, kept
        await engine.serve_versions({2})  # 1 no longer served: evicted as least recently used
        after_drop = engine.resident_versions()
        again = await engine.generate(_request(1))  # loaded back from the store on demand
        return all_served, after_drop, engine.resident_versions(), again.policy_version

    all_served, after_drop, after_reload, served = asyncio.run(main())
    assert sorted(all_served) == [0, 1, 2]
    assert sorted(after_drop) == [0, 2]
    assert served == 1 and set(after_reload) == {0, 1, 2}


def test_an_unknown_version_is_refused_and_others_still_serve(engine: EmbeddedEngine, store: PolicyStore) -> None:
    async def main() -> tuple[UpstreamError, GenerateResult, UpstreamError]:
        engine.use_store(store)
        results = await asyncio.gather(engine.generate(_request(9, "missing")), engine.generate(_request(2, "ok")),
                                       return_exceptions=True)
        missing, ok = results
        try:
            await engine.serve_versions({2, 9})
        except UpstreamError as exc:
            serve_error = exc
        assert isinstance(missing, UpstreamError) and isinstance(ok, GenerateResult)
        return missing, ok, serve_error

    missing, ok, serve_error = asyncio.run(main())
    assert missing.status_code == 503 and missing.error_type == "policy_version_unavailable"
    assert "9" in str(missing) and ok.policy_version == 2
    assert serve_error.error_type == "policy_version_unavailable" and 2 in engine.resident_versions()


def test_resident_versions_lru_never_evicts_protected() -> None:
    resident = ResidentVersions(2)
    empty: dict[str, torch.Tensor] = {}
    assert resident.put(1, empty) == [] and resident.put(2, empty) == []
    assert resident.get(1) is not None  # 1 is now the most recently used
    assert resident.put(3, empty) == [2]
    assert resident.protect({1, 3}) == [] and resident.put(4, empty) == []  # only protected left: over the bound
    assert resident.versions() == [1, 3, 4]
    assert resident.protect({4}) == [1] and resident.versions() == [3, 4]
    with pytest.raises(ValueError):
        ResidentVersions(0)
