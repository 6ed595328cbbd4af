"""Element deltas in the engine's dtype (models/element_delta.py): exact round trips in bf16 and fp32, the
checksums that catch a wrong base or a torn delta, and the choice between sparse and dense encodings."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from models.element_delta import (
    DeltaMismatch,
    Mirror,
    apply_element_delta,
    apply_tensor,
    cast_state,
    choose_encoding,
    encode_tensor,
    encoded_sizes,
    from_tensors,
    plan_element_delta,
    to_tensors,
)
from models.policy_delta import ELEMENTS_DIR, ELEMENTS_WEIGHTS, load_element_delta, read_element_delta
from models.policy_store import PolicyStore


def two_versions(seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A base and the base after a small optimizer-like step: every fp32 element moves by ~1e-4 of a weight of
    ~0.05, plus one row that moves a lot and one tensor that does not move."""
    generator = torch.Generator().manual_seed(seed)
    base = {"model.embed_tokens.weight": torch.randn(64, 16, generator=generator) * 0.05,
            "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=generator) * 0.05,
            "model.layers.0.input_layernorm.weight": torch.ones(16),
            "lm_head.weight": torch.randn(64, 16, generator=generator) * 0.05}
    step = {name: t + torch.randn(t.shape, generator=generator) * 5e-6 for name, t in base.items()}
    step["model.layers.0.input_layernorm.weight"] = base["model.layers.0.input_layernorm.weight"].clone()
    step["lm_head.weight"][3] += 0.5
    return base, step


def bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    from models.element_delta import tensor_digest

    return a.keys() == b.keys() and all(tensor_digest(a[n]) == tensor_digest(b[n]) for n in a)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_delta_reconstructs_the_published_weights_bit_for_bit(dtype: torch.dtype) -> None:
    base, step = two_versions()
    delta = plan_element_delta(base, step, dtype)
    assert delta is not None and delta.dtype == dtype
    held = Mirror.of(cast_state(base, dtype))
    tensors, meta = to_tensors(delta)  # through the file form too
    for candidate in (delta, from_tensors(tensors, meta)):
        result, names = apply_element_delta(held, candidate)
        assert bits_equal(dict(result.tensors), cast_state(step, dtype))
        assert result.digest == candidate.digest == Mirror.of(cast_state(step, dtype)).digest
        assert "model.layers.0.input_layernorm.weight" not in names  # unchanged: not shipped
        assert "lm_head.weight" in names
    fp32_changed = plan_element_delta(base, step, torch.float32)
    assert fp32_changed is not None
    if dtype == torch.bfloat16:  # the point: a small step leaves most bf16 values where they were
        assert delta.changed_elements < fp32_changed.changed_elements // 4
        assert delta.nbytes < delta.full_bytes // 4
    else:  # in fp32 every element of the moved tensors changed
        assert delta.changed_elements == delta.total_elements - 16


def test_equality_is_bitwise_so_signed_zeros_and_nans_survive() -> None:
    before = torch.tensor([0.0, float("nan"), 1.0, 2.0], dtype=torch.bfloat16)
    after = torch.tensor([-0.0, float("nan"), 1.0, 3.0], dtype=torch.bfloat16)
    delta = encode_tensor("t", before, after)
    assert delta is not None and delta.changed == 2  # -0.0 == 0.0 for ==, not for the engine's bits
    result = apply_tensor(before, delta)
    assert torch.signbit(result[0]) and torch.isnan(result[1]) and result[3] == 3.0
    assert encode_tensor("t", after, after.clone()) is None  # NaN != NaN for ==, but nothing changed


def test_a_wrong_base_or_a_torn_delta_is_a_mismatch() -> None:
    base, step = two_versions()
    other, _ = two_versions(seed=1)
    delta = plan_element_delta(base, step, torch.bfloat16)
    assert delta is not None
    with pytest.raises(DeltaMismatch, match="base"):
        apply_element_delta(Mirror.of(cast_state(other, torch.bfloat16)), delta)
    # a mirror that claims the base's digests but holds other values: the tensor's own checksum catches it
    held = Mirror.of(cast_state(base, torch.bfloat16))
    lying = Mirror({**held.tensors, "lm_head.weight": cast_state(other, torch.bfloat16)["lm_head.weight"]},
                   held.digests)
    with pytest.raises(DeltaMismatch, match=re.escape("lm_head.weight")):
        apply_element_delta(lying, delta)
    # one value of the delta altered
    item = next(t for t in delta.tensors if t.encoding != "dense")
    values = item.values.clone()
    values[0] = values[0] + 1
    torn = replace(delta, tensors=tuple(replace(t, values=values) if t is item else t for t in delta.tensors))
    with pytest.raises(DeltaMismatch, match=re.escape(item.name)):
        apply_element_delta(held, torn)


def test_dense_when_a_sparse_form_saves_too_little() -> None:
    # 1,024 bf16 elements: dense 2,048 bytes, bitmask 128 + 2k, indices 6k; sparse must save 10%
    assert choose_encoding(1024, 32, 2) == "indices"  # 192 <= 192
    assert choose_encoding(1024, 33, 2) == "bitmask"  # 198 > 194
    assert choose_encoding(1024, 857, 2) == "bitmask"  # 1,842 < 1,843.2
    assert choose_encoding(1024, 858, 2) == "dense"
    assert choose_encoding(1024, 858, 2, dense_saving=0.0) == "bitmask"
    # with the positions, the gap forms compete: 1 byte per change (8 bits) where changes are close
    assert choose_encoding(1024, 100, 2, positions=np.arange(100) * 10) == "gaps8"  # 300 < 328 < 600


@pytest.mark.parametrize(("numel", "changes", "encoding"), [
    (1024, list(range(0, 1024, 102)), "gaps8"),  # close changes: one byte each (11 + 22 < 66)
    (1024, list(range(0, 1024, 2)), "bitmask"),  # every other element: 128 + 1,024 < 512 + 1,024
    (1024, list(range(1000)), "dense"),  # nearly all: a copy
    (200_000, list(range(0, 200_000, 10_000)), "gaps16"),  # far apart: 2 bytes each (8 bits: 39 escapes each)
    (200_000, [0, 131_000], "gaps16"),  # one escape: (2 + 1) x 2 + 4 = 10 < 12 (indices)
    (300_000, [0, 140_000, 280_000], "indices"),  # two escapes each: (3 + 4) x 2 + 6 = 20 > 18
])
def test_every_encoding_round_trips_and_is_picked_by_size(numel: int, changes: list[int], encoding: str) -> None:
    before = torch.zeros(numel, dtype=torch.bfloat16)
    after = before.clone()
    positions = torch.tensor(changes)
    after[positions] = 1.5
    delta = encode_tensor("t", before, after)
    assert delta is not None and (delta.encoding, delta.changed) == (encoding, len(changes))
    sizes = encoded_sizes(numel, len(changes), 2, positions.numpy())
    assert delta.nbytes == sizes[encoding]
    assert encoding == "dense" or sizes[encoding] == min(sizes.values())
    assert torch.equal(apply_tensor(before, delta), after)


def test_no_element_delta_across_a_change_of_shape_or_names() -> None:
    base, step = two_versions()
    assert plan_element_delta(base, {**step, "extra": torch.ones(1)}, torch.bfloat16) is None
    assert plan_element_delta(base, {**step, "lm_head.weight": torch.ones(16, 64)}, torch.bfloat16) is None


def test_the_store_publishes_the_element_delta_and_a_torn_file_is_refused(tmp_path: Path) -> None:
    base, step = two_versions()
    store = PolicyStore(tmp_path / "policies")
    store.publish(1, base, delta=True, engine_dtype=torch.bfloat16)
    assert read_element_delta(store.path(1)) is None  # nothing before it
    store.publish(2, step, delta=True, engine_dtype=torch.bfloat16)
    info = read_element_delta(store.path(2))
    assert info is not None and (info.base_version, info.dtype) == (1, "bfloat16")
    assert info.nbytes == info.path.stat().st_size < info.full_bytes // 2  # with the file's header
    delta = load_element_delta(store.path(2))
    result, _ = apply_element_delta(Mirror.of(cast_state(store.load_state_dict(1), torch.bfloat16)), delta)
    assert bits_equal(dict(result.tensors), cast_state(store.load_state_dict(2), torch.bfloat16))
    # the next version's base digests come from what the store remembered of 2: the chain still proves out
    _, third = two_versions(seed=2)
    store.publish(3, {**step, "lm_head.weight": third["lm_head.weight"]}, delta=True, engine_dtype=torch.bfloat16)
    result, names = apply_element_delta(result, load_element_delta(store.path(3)))
    assert names == ("lm_head.weight",)
    assert bits_equal(dict(result.tensors), cast_state(store.load_state_dict(3), torch.bfloat16))
    path = store.path(2) / ELEMENTS_DIR / ELEMENTS_WEIGHTS
    path.chmod(0o644)
    torn = bytearray(path.read_bytes())
    torn[-1] ^= 0xFF  # one bit pattern of one value
    path.write_bytes(bytes(torn))
    with pytest.raises(DeltaMismatch, match="sha256"):
        load_element_delta(store.path(2))
