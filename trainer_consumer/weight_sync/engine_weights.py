"""An engine's parameters as the checkpoint names them, for scattering element deltas into them in place.

vLLM does not hold a checkpoint's tensors one to one. It fuses some of them into one parameter (a layer's
``q_proj``, ``k_proj`` and ``v_proj`` are the rows of ``qkv_proj``, in that order; ``gate_proj`` and ``up_proj``
those of ``gate_up_proj``), pads others (the vocabulary rows of ``lm_head``), and on CPU builds it packs each
linear layer's weight into its GEMM kernel's own layout and drops the plain weight (``cpu_linear``, a oneDNN or
sgl-kernel handle; the parameter is left empty). ``placements`` maps each checkpoint tensor onto the rows of
the parameter that holds it; ``EngineWeights`` writes an element delta's values at those rows:

* into the live parameter itself where it holds the tensor plainly (every parameter on GPU builds; norms,
  biases and embeddings on CPU), element by element, nothing else touched;
* where the kernel packed the weight away, into an unpacked twin kept here (built from the checkpoint the
  engine loaded, one copy of those weights), and the changed layers are packed again by the layer's own
  ``quant_method.process_weights_after_loading``; a live weight that a CPU kernel also packed (``lm_head``)
  is packed again the same way.

Every tensor's digest is kept (``models.element_delta.tensor_digest``, hashed once at ``prepare``), so a
delta proves its base before anything is written (``base_digest``) and each written tensor is checked
against its published sha256 after it is. Only torch here: the vLLM worker (``vllm_scatter``) hands in its
model, and the tests a stand-in with the same layout.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from models.element_delta import DeltaMismatch, ElementDelta, changed_positions, state_digest, tensor_digest

# How vLLM fuses the checkpoint's projections of the Llama/Qwen2 family (``packed_modules_mapping`` of
# vllm/model_executor/models/qwen2.py): fused module -> its parts, in row order.
QWEN2_PACKED: dict[str, tuple[str, ...]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
                                            "gate_up_proj": ("gate_proj", "up_proj")}


class LayoutError(ValueError):
    """A checkpoint tensor has no place in the engine's parameters (an architecture this mapping does not know)."""


@dataclass(frozen=True)
class Placement:
    param: str  # the engine's parameter that holds the checkpoint tensor
    row: int  # the tensor's first row in it (dimension 0)
    shape: tuple[int, ...]  # the checkpoint tensor's shape

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_size(self) -> int:
        return math.prod(self.shape[1:])


def placements(shapes: Mapping[str, Sequence[int]],
               packed: Mapping[str, Sequence[str]] = QWEN2_PACKED) -> dict[str, Placement]:
    """Where each checkpoint tensor (name -> shape) lives among the engine's parameters: a fused part at the
    rows after its siblings', anything else at row 0 of the parameter of its own name."""
    part_of = {part: (fused, tuple(parts)) for fused, parts in packed.items() for part in parts}
    out: dict[str, Placement] = {}
    for name, shape in shapes.items():
        module, _, leaf = name.rpartition(".")
        parent, _, last = module.rpartition(".")
        if last not in part_of:
            out[name] = Placement(name, 0, tuple(shape))
            continue
        fused, parts = part_of[last]
        siblings = [f"{parent}.{part}.{leaf}" for part in parts]
        missing = [s for s in siblings if s not in shapes]
        if missing:
            raise LayoutError(f"{name}: the checkpoint lacks {missing}, the other parts of {parent}.{fused}")
        row = sum(int(shapes[s][0]) for s in siblings[:parts.index(last)])
        if any(tuple(shapes[s][1:]) != tuple(shape[1:]) for s in siblings):
            raise LayoutError(f"{name}: the parts of {parent}.{fused} differ beyond their rows")
        out[name] = Placement(f"{parent}.{fused}.{leaf}", row, tuple(shape))
    return out


@dataclass
class _Holder:
    """One engine parameter: where its values are, and how the layer's kernel learns of a change."""

    module: nn.Module
    leaf: str
    twin_values: torch.Tensor | None  # the twin of a weight the kernel packed away; None: the live parameter
    packed: bool  # the layer's kernel keeps its own copy (CPU builds): pack it again after a change

    @property
    def twin(self) -> bool:
        return self.twin_values is not None

    @property
    def values(self) -> torch.Tensor:
        """Where the values are now (a live parameter is looked up each time: processing may replace it)."""
        return self.twin_values if self.twin_values is not None else getattr(self.module, self.leaf).data


def _logical_rows(module: nn.Module, leaf: str, needed: int) -> int:
    """Rows of a weight the kernel packed away: what the layer was built with (vLLM's linear layers say),
    at least what the checkpoint fills."""
    sizes = getattr(module, "output_partition_sizes", None)
    if leaf == "weight" and sizes:
        if sum(sizes) < needed:
            raise LayoutError(f"{type(module).__name__}: {sum(sizes)} rows, the checkpoint fills {needed}")
        return int(sum(sizes))
    return needed


class EngineWeights:
    """The engine's parameters behind checkpoint names (see the module's docstring)."""

    def __init__(self, model: nn.Module, checkpoint: Mapping[str, torch.Tensor],
                 packed: Mapping[str, Sequence[str]] = QWEN2_PACKED) -> None:
        """``checkpoint``: the full checkpoint the engine loaded last (its names and values); each tensor is
        cast to the dtype of the parameter that holds it, the cast the engine's loader did. A live parameter
        must equal the checkpoint where it holds it (a wrong layout is refused here, not found in the logits)."""
        self.places = placements({n: tuple(t.shape) for n, t in checkpoint.items()}, packed)
        params = dict(model.named_parameters(remove_duplicate=False))
        modules = dict(model.named_modules(remove_duplicate=False))
        self._holders: dict[str, _Holder] = {}
        by_param: dict[str, list[str]] = {}
        for name, place in self.places.items():
            by_param.setdefault(place.param, []).append(name)
        for param_name, names in by_param.items():
            if param_name not in params:
                raise LayoutError(f"{names[0]}: the engine has no parameter {param_name}")
            module_name, _, leaf = param_name.rpartition(".")
            module, param = modules[module_name], params[param_name]
            needed = max(self.places[n].row + self.places[n].rows for n in names)
            row_size = self.places[names[0]].row_size
            packed_kernel = hasattr(module, "cpu_linear") and hasattr(module, "quant_method")
            if param.numel() == 0:  # the kernel packed the weight away: keep an unpacked twin
                if not packed_kernel:
                    raise LayoutError(f"{param_name} is empty and no kernel holds it")
                shape = (_logical_rows(module, leaf, needed), *self.places[names[0]].shape[1:])
                values = torch.zeros(shape, dtype=param.dtype, device=param.device)
                self._holders[param_name] = _Holder(module, leaf, values, True)
            else:
                data = param.data
                if not data.is_contiguous() or data.shape[0] < needed or math.prod(data.shape[1:]) != row_size:
                    raise LayoutError(f"{param_name}: {tuple(data.shape)} cannot hold {names} as rows")
                self._holders[param_name] = _Holder(module, leaf, None, packed_kernel)
        for name, tensor in checkpoint.items():
            view = self._view(name)
            cast = tensor.detach().to(view.device, view.dtype).reshape(view.shape)
            if self._holders[self.places[name].param].twin:
                view.copy_(cast)
            elif not torch.equal(view, cast):
                raise LayoutError(f"{name}: the engine's {self.places[name].param} does not hold the checkpoint's "
                                  "values at the rows mapped to it")
        self.dtype = next(iter(self._holders.values())).values.dtype if self._holders else torch.float32
        self.digests = {name: tensor_digest(self._view(name)) for name in self.places}
        self.broken = ""  # why the weights are not what ``digests`` says (a scatter failed after writing)

    @property
    def digest(self) -> str:
        return state_digest(self.digests)

    @property
    def twin_bytes(self) -> int:
        """Memory the twins of packed weights take (the price of scattering on a CPU build)."""
        return sum(h.values.numel() * h.values.element_size() for h in self._holders.values() if h.twin)

    def _view(self, name: str) -> torch.Tensor:
        place = self.places[name]
        values = self._holders[place.param].values
        if not values.is_contiguous():
            raise LayoutError(f"{place.param} is no longer a contiguous tensor")
        flat = values.view(-1)
        start = place.row * place.row_size
        return flat[start:start + math.prod(place.shape)].view(place.shape)

    def apply(self, delta: ElementDelta) -> dict[str, Any]:
        """Write ``delta``'s values in place. Refused before anything is written (DeltaMismatch) when these
        weights are not its base or it does not fit them; a tensor that does not hash to its published value
        after the write raises too, and then the weights are half-written: the caller must load a full
        checkpoint (and ``prepare`` again)."""
        started = time.perf_counter()
        if self.broken:
            raise DeltaMismatch(f"the weights were left half-written ({self.broken}): load a full checkpoint")
        if delta.base_digest != self.digest:
            raise DeltaMismatch("the engine's weights are not the delta's base version")
        if delta.dtype != self.dtype:
            raise DeltaMismatch(f"the delta is in {delta.dtype}, the engine holds {self.dtype}")
        plan = []
        for item in delta.tensors:
            if item.name not in self.places:
                raise DeltaMismatch(f"{item.name}: not a tensor of the engine's checkpoint")
            view = self._view(item.name)
            if view.numel() != item.numel or item.values.dtype != view.dtype:
                raise DeltaMismatch(f"{item.name}: holds {view.dtype} x{view.numel()}, the delta is "
                                    f"{item.values.dtype} x{item.numel}")
            plan.append((item, view, changed_positions(item)))
        touched: set[str] = set()
        self.broken = "a scatter did not finish"  # until every written tensor is proven
        for item, view, positions in plan:
            flat = view.view(-1)
            values = item.values.to(flat.device)
            if positions is None:
                flat.copy_(values)
            else:
                flat[positions.to(flat.device)] = values
            touched.add(self.places[item.name].param)
        written = time.perf_counter()
        digests = dict(self.digests)
        try:
            for item, view, _ in plan:
                if tensor_digest(view.cpu()) != item.sha256:
                    raise DeltaMismatch(f"{item.name}: the scattered tensor does not match its published sha256")
                digests[item.name] = item.sha256
            if state_digest(digests) != delta.digest:
                raise DeltaMismatch("the scattered weights do not match the published version's digest")
        except DeltaMismatch as exc:
            self.broken = str(exc)
            raise
        finally:
            repacked = self._repack(touched)
        self.digests, self.broken = digests, ""
        return {"tensors": len(plan), "elements": delta.changed_elements, "parameters": len(touched),
                "repacked": len(repacked), "scatter_s": written - started,
                "check_and_repack_s": time.perf_counter() - written}

    def _repack(self, params: set[str]) -> list[str]:
        """Hand each changed layer whose kernel keeps its own copy of the weight the new values (the layer's
        own ``process_weights_after_loading``, as after a load; a twin goes in as the weight it packs). Once
        per layer; a change of the bias alone repacks too (the kernel may hold a converted copy of it)."""
        done = []
        modules = {param.rpartition(".")[0] for param in params}
        for module_name in sorted(modules):
            holder = self._holders.get(f"{module_name}.weight")
            if holder is None or not holder.packed:
                continue
            if holder.twin_values is not None:
                holder.module.weight = nn.Parameter(holder.twin_values, requires_grad=False)
            holder.module.quant_method.process_weights_after_loading(holder.module)
            done.append(module_name)
        return done
