"""A policy version as the *elements* that changed since the version before it, in the dtype the engine serves.

A small optimizer step changes nearly every tensor, so a delta of whole tensors (``models.policy_delta``) moves
nearly the whole checkpoint. In the engine's dtype most elements do not change at all: bf16 keeps 8 bits of
mantissa, and an update far smaller than a weight rounds back to the same bf16 value. So the delta is computed
there: both versions are cast to the engine's dtype (the cast the engine's own loader does: round to nearest
even), compared bit for bit (not with ``==``: -0.0 equals 0.0 and NaN equals nothing, and either would make the
reconstruction differ from the published weights), and each tensor that changed is shipped as one of

    gaps8    the distance from each changed element to the one before as one byte (0: "255 further, no
             element", for longer gaps), and the new values: 1 byte per change where changes are dense
    gaps16   the same in two bytes (0: 65,535 further): where changes are sparser
    indices  the flat positions of the changed elements (int32, int64 past 2**31) and their new values
    bitmask  one bit per element (numpy ``packbits``, little bit order) and the new values of the set bits
    dense    the whole tensor (when a tensor changed mostly, a sparse form saves too little to pay its apply)

whichever is smallest, unless it saves less than ``dense_saving`` of the dense size (then dense). Every changed
tensor carries the sha256 of its reconstructed value, and the delta the digest of the base state and of the
resulting state (``state_digest``), so the applier proves it holds exactly the base and reconstructed exactly
the published weights; anything else raises ``DeltaMismatch`` and the caller loads the full checkpoint.

Pure: tensors in, tensors out, no files (``to_tensors``/``from_tensors`` map a delta to the flat name -> tensor
dict and JSON-able metadata that ``models.policy_delta`` writes as safetensors).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

Encoding = Literal["gaps8", "gaps16", "indices", "bitmask", "dense"]
_GAP_BITS: dict[str, int] = {"gaps8": 8, "gaps16": 16}
DEFAULT_DENSE_SAVING = 0.1  # a sparse form must save at least this share of the dense bytes
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_INT32_MAX = 2**31 - 1


class DeltaMismatch(ValueError):
    """The applier's weights, or what it reconstructed, are not what the delta says: load the full checkpoint."""


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of the same width: equal exactly when their bits are."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(_BITS[flat.element_size()])


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (what the engine holds, bit for bit)."""
    digest = hashlib.sha256(f"{tensor.dtype}|{tuple(tensor.shape)}|".encode())
    digest.update(_raw(tensor).numpy().tobytes())
    return digest.hexdigest()


def state_digest(digests: Mapping[str, str]) -> str:
    """One digest of a whole state dict from its tensors' digests (``tensor_digest``), by name."""
    digest = hashlib.sha256()
    for name in sorted(digests):
        digest.update(f"{name}={digests[name]}\n".encode())
    return digest.hexdigest()


def cast_state(state: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The state dict as an engine serving ``dtype`` holds it (floating tensors cast; others as they are)."""
    return {name: (t.detach().to("cpu", dtype) if t.is_floating_point() else t.detach().to("cpu")).contiguous()
            for name, t in state.items()}


@dataclass(frozen=True)
class Mirror:
    """What an engine holds: its weights in the engine's dtype and their digests (hashed once, then carried)."""

    tensors: Mapping[str, torch.Tensor]
    digests: Mapping[str, str]

    @classmethod
    def of(cls, state: Mapping[str, torch.Tensor]) -> Mirror:
        return cls(dict(state), {name: tensor_digest(t) for name, t in state.items()})

    @property
    def digest(self) -> str:
        return state_digest(self.digests)


@dataclass(frozen=True)
class TensorDelta:
    name: str
    encoding: Encoding
    changed: int  # elements whose bits changed
    numel: int
    index: torch.Tensor | None  # gaps8: uint8, gaps16: int16 (uint16 bits), indices: int32/int64 positions;
    # bitmask: packed uint8; dense: None
    values: torch.Tensor  # the new values (dense: the whole tensor, flat)
    sha256: str  # tensor_digest of the reconstructed tensor

    @property
    def nbytes(self) -> int:
        """What this tensor's delta moves."""
        index = 0 if self.index is None else self.index.numel() * self.index.element_size()
        return index + self.values.numel() * self.values.element_size()


@dataclass(frozen=True)
class ElementDelta:
    dtype: torch.dtype  # the engine's dtype the delta was computed in
    base_digest: str  # state_digest of the version it applies to
    digest: str  # state_digest of the version it makes
    tensors: tuple[TensorDelta, ...]  # the changed tensors, by name
    full_bytes: int  # the whole state in the engine's dtype (what a full sync moves)
    total_elements: int

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def changed_elements(self) -> int:
        return sum(t.changed for t in self.tensors)

    @property
    def changed_bytes(self) -> int:
        """The bytes of the elements that changed (what an ideal delta with free positions would move)."""
        return sum(t.changed * t.values.element_size() for t in self.tensors)

    def encodings(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.encoding] = counts.get(t.encoding, 0) + 1
        return counts


def _gaps(positions: np.ndarray) -> np.ndarray:
    """Distances between sorted positions, the first from -1 (so every gap is at least 1)."""
    return np.diff(positions.astype(np.int64), prepend=-1)


def _escapes(gaps: np.ndarray, bits: int) -> int:
    """How many "no element, skip the most" entries gaps of ``bits`` bits need."""
    return int(((gaps - 1) // (2**bits - 1)).sum())


def encoded_sizes(numel: int, changed: int, element_size: int,
                  positions: np.ndarray | None = None) -> dict[Encoding, int]:
    """Bytes each encoding of a tensor with ``changed`` of ``numel`` elements changed moves (the gap
    encodings need the sorted ``positions``; without them they are left out)."""
    index_size = 4 if numel - 1 <= _INT32_MAX else 8
    sizes: dict[Encoding, int] = {"indices": changed * (index_size + element_size),
                                  "bitmask": math.ceil(numel / 8) + changed * element_size,
                                  "dense": numel * element_size}
    if positions is not None:
        gaps = _gaps(positions)
        for name, bits in _GAP_BITS.items():
            sizes[name] = (changed + _escapes(gaps, bits)) * bits // 8 + changed * element_size  # type: ignore[index]
    return sizes


def choose_encoding(numel: int, changed: int, element_size: int, dense_saving: float = DEFAULT_DENSE_SAVING,
                    positions: np.ndarray | None = None) -> Encoding:
    """The smallest encoding, unless the smallest sparse one saves less than ``dense_saving`` of the dense
    bytes: then dense (a tensor that changed mostly is cheaper to copy than to scatter into)."""
    sizes = encoded_sizes(numel, changed, element_size, positions)
    dense = sizes.pop("dense")
    sparse = min(sizes, key=lambda name: sizes[name])  # a tie goes to the first listed
    return sparse if sizes[sparse] < dense * (1.0 - dense_saving) else "dense"


def _encode_gaps(positions: np.ndarray, bits: int) -> torch.Tensor:
    most = 2**bits - 1
    gaps = _gaps(positions)
    escapes = (gaps - 1) // most
    out = np.zeros(len(gaps) + int(escapes.sum()), dtype=np.uint8 if bits == 8 else np.uint16)
    out[np.cumsum(escapes + 1) - 1] = gaps - escapes * most  # each change after its escapes, 1..most
    return torch.from_numpy(out if bits == 8 else out.view(np.int16))


def _decode_gaps(index: torch.Tensor, bits: int) -> np.ndarray:
    entries = index.numpy() if bits == 8 else index.numpy().view(np.uint16)
    steps = np.where(entries == 0, 2**bits - 1, entries).astype(np.int64)
    return (np.cumsum(steps) - 1)[entries != 0]


def encode_tensor(name: str, previous: torch.Tensor, current: torch.Tensor,
                  dense_saving: float = DEFAULT_DENSE_SAVING) -> TensorDelta | None:
    """The delta that turns ``previous`` into ``current`` (same dtype and shape); None when no bit differs."""
    if previous.dtype != current.dtype or previous.shape != current.shape:
        raise ValueError(f"{name}: {previous.dtype}{tuple(previous.shape)} -> {current.dtype}{tuple(current.shape)}"
                         " is not an element delta")
    mask = _raw(previous) != _raw(current)
    changed = int(mask.sum())
    if not changed:
        return None
    flat = current.detach().contiguous().reshape(-1)
    positions = mask.nonzero().reshape(-1)
    encoding = choose_encoding(flat.numel(), changed, flat.element_size(), dense_saving, positions.numpy())
    index: torch.Tensor | None
    if encoding == "dense":
        index, values = None, flat.clone()
    elif encoding == "indices":
        index = positions.to(torch.int32 if flat.numel() - 1 <= _INT32_MAX else torch.int64)
        values = flat[positions].clone()
    elif encoding in _GAP_BITS:
        index, values = _encode_gaps(positions.numpy(), _GAP_BITS[encoding]), flat[positions].clone()
    else:
        index = torch.from_numpy(np.packbits(mask.numpy(), bitorder="little"))
        values = flat[mask].clone()
    return TensorDelta(name, encoding, changed, flat.numel(), index, values, tensor_digest(current))


def changed_positions(delta: TensorDelta) -> torch.Tensor | None:
    """The flat positions (int64, ascending) the delta's values go to; None for a dense delta (all of them).
    DeltaMismatch when they do not pair with the values or point past the tensor."""
    if delta.encoding == "dense":
        if delta.values.numel() != delta.numel:
            raise DeltaMismatch(f"{delta.name}: {delta.values.numel()} dense values for {delta.numel} elements")
        return None
    assert delta.index is not None
    if delta.encoding == "indices":
        positions = delta.index.to(torch.int64)
    elif delta.encoding in _GAP_BITS:
        positions = torch.from_numpy(_decode_gaps(delta.index, _GAP_BITS[delta.encoding]))
    else:
        bits = np.unpackbits(delta.index.numpy(), count=delta.numel, bitorder="little")
        positions = torch.from_numpy(np.flatnonzero(bits))
    if positions.numel() != delta.values.numel():
        raise DeltaMismatch(f"{delta.name}: {positions.numel()} positions for {delta.values.numel()} values")
    if positions.numel() and (int(positions.max()) >= delta.numel or int(positions.min()) < 0):
        raise DeltaMismatch(f"{delta.name}: a position outside the tensor's {delta.numel} elements")
    return positions


def apply_tensor(previous: torch.Tensor, delta: TensorDelta) -> torch.Tensor:
    """``previous`` with ``delta`` applied (a new tensor); DeltaMismatch unless it hashes to ``delta.sha256``."""
    if previous.numel() != delta.numel or previous.dtype != delta.values.dtype:
        raise DeltaMismatch(f"{delta.name}: holds {previous.dtype} x{previous.numel()}, the delta is "
                            f"{delta.values.dtype} x{delta.numel}")
    positions = changed_positions(delta)
    if positions is None:
        result = delta.values.reshape(previous.shape).clone()
    else:
        flat = previous.detach().contiguous().reshape(-1).clone()
        flat[positions] = delta.values
        result = flat.reshape(previous.shape)
    if tensor_digest(result) != delta.sha256:
        raise DeltaMismatch(f"{delta.name}: the reconstructed tensor does not match its published sha256")
    return result


def plan_element_delta(previous: Mapping[str, torch.Tensor], current: Mapping[str, torch.Tensor],
                       dtype: torch.dtype, dense_saving: float = DEFAULT_DENSE_SAVING,
                       previous_digests: Mapping[str, str] | None = None) -> ElementDelta | None:
    """What changed from ``previous`` to ``current`` in the engine's ``dtype`` (both are cast to it); None when
    no element delta can describe the change (a tensor added, removed or reshaped: only a full load can).
    ``previous_digests``: the base's tensor digests when the caller holds them (saves hashing the base)."""
    if previous.keys() != current.keys():
        return None
    if any(previous[n].shape != current[n].shape for n in current):
        return None
    before, after = cast_state(previous, dtype), cast_state(current, dtype)
    base = dict(previous_digests) if previous_digests is not None else Mirror.of(before).digests
    digests = dict(base)
    tensors: list[TensorDelta] = []
    for name in sorted(after):
        delta = encode_tensor(name, before[name], after[name], dense_saving)
        if delta is not None:
            tensors.append(delta)
            digests[name] = delta.sha256
    return ElementDelta(dtype, state_digest(base), state_digest(digests), tuple(tensors),
                        sum(t.numel() * t.element_size() for t in after.values()),
                        sum(t.numel() for t in after.values()))


def apply_element_delta(mirror: Mirror, delta: ElementDelta) -> tuple[Mirror, tuple[str, ...]]:
    """The engine's next weights from what it holds and the delta, and the names of the tensors that changed.
    DeltaMismatch when ``mirror`` is not the delta's base, a tensor does not reconstruct to its published
    sha256, or the resulting state is not the published one (the caller falls back to a full load)."""
    if mirror.digest != delta.base_digest:
        raise DeltaMismatch("the weights held are not the delta's base version")
    tensors, digests = dict(mirror.tensors), dict(mirror.digests)
    for item in delta.tensors:
        if item.name not in tensors:
            raise DeltaMismatch(f"{item.name}: not a tensor of the weights held")
        tensors[item.name] = apply_tensor(tensors[item.name], item)
        digests[item.name] = item.sha256
    if state_digest(digests) != delta.digest:
        raise DeltaMismatch("the reconstructed weights do not match the published version's digest")
    return Mirror(tensors, digests), tuple(t.name for t in delta.tensors)


_INDEX, _VALUES = "::index", "::values"


def to_tensors(delta: ElementDelta) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The delta as flat named tensors (for a safetensors file) and JSON-able metadata."""
    tensors: dict[str, torch.Tensor] = {}
    entries = []
    for item in delta.tensors:
        tensors[item.name + _VALUES] = item.values
        if item.index is not None:
            tensors[item.name + _INDEX] = item.index
        entries.append({"name": item.name, "encoding": item.encoding, "changed": item.changed,
                        "numel": item.numel, "sha256": item.sha256})
    meta = {"dtype": str(delta.dtype).removeprefix("torch."), "base_digest": delta.base_digest,
            "digest": delta.digest, "full_bytes": delta.full_bytes, "total_elements": delta.total_elements,
            "tensors": entries}
    return tensors, meta


def from_tensors(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> ElementDelta:
    """The inverse of ``to_tensors``; DeltaMismatch when the file lacks a tensor its metadata names."""
    items = []
    try:
        for entry in meta["tensors"]:
            name = str(entry["name"])
            encoding: Encoding = entry["encoding"]
            items.append(TensorDelta(name, encoding, int(entry["changed"]), int(entry["numel"]),
                                     tensors[name + _INDEX] if encoding != "dense" else None,
                                     tensors[name + _VALUES], str(entry["sha256"])))
        dtype = getattr(torch, str(meta["dtype"]))
    except (KeyError, AttributeError) as exc:
        raise DeltaMismatch(f"the element delta is incomplete: {exc}") from exc
    return ElementDelta(dtype, str(meta["base_digest"]), str(meta["digest"]), tuple(items),
                        int(meta["full_bytes"]), int(meta["total_elements"]))
