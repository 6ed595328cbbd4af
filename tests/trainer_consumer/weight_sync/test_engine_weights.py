"""Element deltas written into an engine's parameters in place (``engine_weights``), on a stand-in with vLLM's
layout: q/k/v fused into ``qkv_proj`` and gate/up into ``gate_up_proj``, a padded ``lm_head``, and the CPU
build's packed kernels (the weight dropped after loading, the kernel holding its own copy). The real vLLM:
tests/producers/upstreams/vllm_live/test_scatter_live.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.element_delta import DeltaMismatch, plan_element_delta
from trainer_consumer.weight_sync.engine_weights import EngineWeights, LayoutError, placements

H, Q, KV, FF, VOCAB, PADDED = 8, 8, 4, 12, 10, 16


class PackLinear:
    """Like vLLM's CPU ``UnquantizedLinearMethod``: the kernel takes a copy and the weight is dropped."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        packed = layer.weight.detach().clone()
        layer.cpu_linear = lambda x, weight, bias: nn.functional.linear(x, packed, bias)
        layer.weight = nn.Parameter(torch.empty(0), requires_grad=False)


class PackKeep(PackLinear):
    """Like the CPU embedding method: the kernel takes a copy, the weight stays (lookups read it)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        packed = layer.weight.detach().clone()
        layer.cpu_linear = lambda x, weight, bias: nn.functional.linear(x, packed, bias)


class Fused(nn.Module):
    def __init__(self, rows: int, cols: int, bias: bool, method: PackLinear) -> None:
        super().__init__()
        self.output_partition_sizes = [rows]
        self.weight = nn.Parameter(torch.zeros(rows, cols), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(rows), requires_grad=False) if bias else None
        self.quant_method = method

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cpu_linear(x, self.weight, self.bias)


def checkpoint(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"model.layers.0.self_attn.q_proj.weight": (Q, H), "model.layers.0.self_attn.k_proj.weight": (KV, H),
              "model.layers.0.self_attn.v_proj.weight": (KV, H), "model.layers.0.self_attn.q_proj.bias": (Q,),
              "model.layers.0.self_attn.k_proj.bias": (KV,), "model.layers.0.self_attn.v_proj.bias": (KV,),
              "model.layers.0.mlp.gate_proj.weight": (FF, H), "model.layers.0.mlp.up_proj.weight": (FF, H),
              "model.layers.0.input_layernorm.weight": (H,), "lm_head.weight": (VOCAB, H)}
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def engine(state: dict[str, torch.Tensor]) -> nn.Module:
    """The stand-in as vLLM leaves it after loading ``state``: fused, padded, packed."""
    model = nn.Module()
    layer = nn.Module()
    layer.self_attn, layer.mlp = nn.Module(), nn.Module()
    layer.self_attn.qkv_proj = Fused(Q + 2 * KV, H, True, PackLinear())
    layer.mlp.gate_up_proj = Fused(2 * FF, H, False, PackLinear())
    layer.input_layernorm = nn.Module()
    layer.input_layernorm.weight = nn.Parameter(state["model.layers.0.input_layernorm.weight"].clone())
    model.model = nn.Module()
    model.model.layers = nn.ModuleList([layer])
    model.lm_head = Fused(PADDED, H, False, PackKeep())
    p = "model.layers.0."
    with torch.no_grad():
        layer.self_attn.qkv_proj.weight.copy_(torch.cat([state[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
        layer.self_attn.qkv_proj.bias.copy_(torch.cat([state[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]))
        layer.mlp.gate_up_proj.weight.copy_(torch.cat([state[p + "mlp.gate_proj.weight"],
                                                       state[p + "mlp.up_proj.weight"]]))
        model.lm_head.weight[:VOCAB] = state["lm_head.weight"]
    for module in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj, model.lm_head):
        module.quant_method.process_weights_after_loading(module)
    return model


def outputs(model: nn.Module) -> list[torch.Tensor]:
    x = torch.linspace(-1, 1, H).reshape(1, H)
    layer = model.model.layers[0]
    return [layer.self_attn.qkv_proj(x), layer.mlp.gate_up_proj(x), model.lm_head(x)[:, :VOCAB],
            layer.input_layernorm.weight.detach().clone()]


def sparse(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.where(torch.rand(t.shape, generator=g) < 0.2, t + 1.0, t) for n, t in state.items()}


def test_fused_parts_sit_at_their_rows_and_unknown_layouts_are_refused() -> None:
    places = placements({n: tuple(t.shape) for n, t in checkpoint(0).items()})
    assert places["model.layers.0.self_attn.k_proj.weight"].param == "model.layers.0.self_attn.qkv_proj.weight"
    assert [places[f"model.layers.0.self_attn.{n}_proj.weight"].row for n in "qkv"] == [0, Q, Q + KV]
    assert places["model.layers.0.self_attn.v_proj.bias"].row == Q + KV
    assert places["model.layers.0.mlp.up_proj.weight"].row == FF
    assert places["lm_head.weight"].param == "lm_head.weight"
    with pytest.raises(LayoutError, match="lacks"):
        placements({"model.layers.0.mlp.gate_proj.weight": (FF, H)})


def test_a_scattered_delta_serves_exactly_as_the_new_weights_loaded_whole() -> None:
    v1 = checkpoint(1)
    v2 = sparse(v1, 2)
    v3 = sparse(v2, 3)
    model = engine(v1)
    weights = EngineWeights(model, v1)
    assert weights.twin_bytes == 4 * H * (Q + 2 * KV + 2 * FF)  # the packed linears' weights, once
    for before, after in ((v1, v2), (v2, v3)):
        delta = plan_element_delta(before, after, torch.float32)
        assert delta is not None and 0 < delta.changed_elements < 0.4 * delta.total_elements
        result = weights.apply(delta)
        assert result["repacked"] == 3 and result["tensors"] == len(after)
        for got, want in zip(outputs(model), outputs(engine(after)), strict=True):
            assert torch.equal(got, want)


def test_a_delta_against_other_weights_is_refused_before_anything_is_written() -> None:
    v1 = checkpoint(1)
    model = engine(v1)
    weights = EngineWeights(model, v1)
    v2 = sparse(v1, 2)
    stranger = plan_element_delta(v2, sparse(v2, 3), torch.float32)  # its base is v2, the engine holds v1
    assert stranger is not None
    with pytest.raises(DeltaMismatch, match="base"):
        weights.apply(stranger)
    assert all(torch.equal(a, b) for a, b in zip(outputs(model), outputs(engine(v1)), strict=True))
    right = plan_element_delta(v1, v2, torch.float32)
    assert right is not None
    weights.apply(right)  # still the base: the right delta goes through


def test_a_value_that_does_not_hash_to_its_published_digest_leaves_the_weights_refusing() -> None:
    from dataclasses import replace

    v1 = checkpoint(1)
    weights = EngineWeights(engine(v1), v1)
    delta = plan_element_delta(v1, sparse(v1, 2), torch.float32)
    assert delta is not None
    lying = replace(delta, tensors=(replace(delta.tensors[0], sha256="0" * 64), *delta.tensors[1:]))
    with pytest.raises(DeltaMismatch, match="sha256"):
        weights.apply(lying)
    with pytest.raises(DeltaMismatch, match="half-written"):
        weights.apply(delta)  # until a full load and a new prepare


def test_an_engine_that_does_not_hold_the_checkpoint_where_mapped_is_refused() -> None:
    v1 = checkpoint(1)
    model = engine(v1)
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0  # a live weight that differs from the checkpoint
    with pytest.raises(LayoutError, match="lm_head"):
        EngineWeights(model, v1)
