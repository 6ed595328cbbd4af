"""A policy version as a delta against the one before it: only the weights that changed, for an engine that
already holds the previous version (a weight sync that moves only what changed).

The unit moved is a *weight group*, not a single tensor: vLLM fuses a transformer layer's projections
(q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``), and its in-place reload leaves a fused parameter
half-written when only some of its parts arrive. So when any tensor of a group changed, every tensor of
the group is in the delta. A group is one transformer layer (``model.layers.N``) or, outside the layers,
one module (``model.embed_tokens``, ``lm_head``, ``model.norm``).

The delta lives inside the version's directory (``delta/model.safetensors`` and ``delta.json``), written
before the version appears, so whoever sees the version sees its delta too. ``delta.json`` names the base
version and its sha256 (the full checkpoint the delta applies to), the sha256 of the delta file, the groups
and tensors moved, and the bytes: ``delta_bytes`` (what a delta sync moves), ``changed_bytes`` (the bytes of
the elements that really changed: what an element-sparse delta would move) and ``full_bytes`` (the whole
checkpoint). A reader applies it only when the engine is at the base version and the file matches its
checksum; anything else is a full load (``DeltaInfo.applies_to``).

Beside it, the *element* delta (``models.element_delta``): only the elements that changed in the engine's dtype,
``elements/delta.safetensors`` and ``elements.json`` (a directory of its own: vLLM's reload of ``delta/`` reads
every safetensors file there) (base version, the file's sha256, its bytes, the dtype, the
digests that prove the reconstruction). On a real training step every group changes, so the group delta moves
nearly the whole checkpoint; the element delta moves what really changed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from models.element_delta import DeltaMismatch, ElementDelta, from_tensors, to_tensors

DELTA_DIR = "delta"
DELTA_META = "delta.json"
DELTA_WEIGHTS = "model.safetensors"
ELEMENTS_DIR = "elements"
ELEMENTS_META = "elements.json"
ELEMENTS_WEIGHTS = "delta.safetensors"
_LAYER = re.compile(r"^(.*\.layers\.\d+)\.")


def weight_group(name: str) -> str:
    """The group a tensor moves with: its transformer layer, else its module."""
    match = _LAYER.match(name)
    if match:
        return match.group(1)
    return name.rsplit(".", 1)[0] if "." in name else name


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass(frozen=True)
class DeltaPlan:
    """What changed between two state dicts (pure: no files)."""

    groups: tuple[str, ...]  # changed groups, sorted
    tensors: tuple[str, ...]  # every tensor of the changed groups, sorted
    delta_bytes: int
    changed_bytes: int
    full_bytes: int


def plan_delta(previous: Mapping[str, torch.Tensor], current: Mapping[str, torch.Tensor]) -> DeltaPlan | None:
    """The groups of ``current`` that differ from ``previous``; None when no delta can describe the change
    (a tensor added, removed, reshaped or of another dtype: only a full load can)."""
    if previous.keys() != current.keys():
        return None
    changed_groups: set[str] = set()
    changed_bytes = 0
    for name, tensor in current.items():
        before = previous[name]
        if before.shape != tensor.shape or before.dtype != tensor.dtype:
            return None
        differs = int(torch.count_nonzero(before != tensor)) if tensor.numel() else 0
        if differs:
            changed_groups.add(weight_group(name))
            changed_bytes += differs * tensor.element_size()
    moved = sorted(n for n in current if weight_group(n) in changed_groups)
    return DeltaPlan(tuple(sorted(changed_groups)), tuple(moved), sum(tensor_bytes(current[n]) for n in moved),
                     changed_bytes, sum(tensor_bytes(t) for t in current.values()))


@dataclass(frozen=True)
class DeltaInfo:
    base_version: int
    base_sha256: str
    sha256: str  # of delta/model.safetensors
    groups: tuple[str, ...]
    tensors: tuple[str, ...]
    delta_bytes: int
    changed_bytes: int
    full_bytes: int
    path: Path  # the delta directory (what the engine's loader reads)

    def applies_to(self, engine_version: int | None, base_sha256: str) -> bool:
        """Whether an engine at ``engine_version``, whose weights are the checkpoint ``base_sha256``, reaches
        this version by loading the delta: the base must be exactly what it holds, and the file intact."""
        return (engine_version == self.base_version and base_sha256 == self.base_sha256
                and (self.path / DELTA_WEIGHTS).is_file() and file_sha256(self.path / DELTA_WEIGHTS) == self.sha256)


def write_delta(version_dir: Path, plan: DeltaPlan, current: Mapping[str, torch.Tensor], base_version: int,
                base_sha256: str) -> None:
    """Write the delta files into ``version_dir`` (a staging directory, before it is published)."""
    from safetensors.torch import save_file

    directory = version_dir / DELTA_DIR
    directory.mkdir()
    weights = directory / DELTA_WEIGHTS
    save_file({n: current[n] for n in plan.tensors}, str(weights),
              metadata={"tokentrail_delta_base_version": str(base_version)})
    meta = {"base_version": base_version, "base_sha256": base_sha256, "sha256": file_sha256(weights),
            "groups": list(plan.groups), "tensors": list(plan.tensors), "delta_bytes": plan.delta_bytes,
            "changed_bytes": plan.changed_bytes, "full_bytes": plan.full_bytes}
    (version_dir / DELTA_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def read_delta(version_dir: Path) -> DeltaInfo | None:
    """The delta published with a version, or None (published without one)."""
    try:
        meta = json.loads((version_dir / DELTA_META).read_text())
    except FileNotFoundError:
        return None
    return DeltaInfo(int(meta["base_version"]), str(meta["base_sha256"]), str(meta["sha256"]),
                     tuple(meta["groups"]), tuple(meta["tensors"]), int(meta["delta_bytes"]),
                     int(meta["changed_bytes"]), int(meta["full_bytes"]), version_dir / DELTA_DIR)


@dataclass(frozen=True)
class ElementDeltaInfo:
    """An element delta as published (its tensors are read only when it is applied: ``load_element_delta``)."""

    base_version: int
    sha256: str  # of elements/delta.safetensors
    dtype: str
    nbytes: int  # the file's size: what an element delta sync moves
    changed_elements: int
    total_elements: int
    full_bytes: int  # the whole state in ``dtype``
    encodings: dict[str, int]
    path: Path  # elements/delta.safetensors


def write_element_delta(version_dir: Path, delta: ElementDelta, base_version: int) -> None:
    """Write the element delta into ``version_dir`` (a staging directory, before it is published)."""
    from safetensors.torch import save_file

    directory = version_dir / ELEMENTS_DIR
    directory.mkdir()
    weights = directory / ELEMENTS_WEIGHTS
    tensors, meta = to_tensors(delta)
    save_file(tensors, str(weights), metadata={"tokentrail_delta_base_version": str(base_version)})
    meta.update({"base_version": base_version, "sha256": file_sha256(weights), "nbytes": weights.stat().st_size,
                 "changed_elements": delta.changed_elements, "encodings": delta.encodings()})
    (version_dir / ELEMENTS_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def read_element_delta(version_dir: Path) -> ElementDeltaInfo | None:
    """The element delta published with a version, or None (published without one)."""
    try:
        meta = json.loads((version_dir / ELEMENTS_META).read_text())
    except FileNotFoundError:
        return None
    return ElementDeltaInfo(int(meta["base_version"]), str(meta["sha256"]), str(meta["dtype"]), int(meta["nbytes"]),
                            int(meta["changed_elements"]), int(meta["total_elements"]), int(meta["full_bytes"]),
                            dict(meta["encodings"]), version_dir / ELEMENTS_DIR / ELEMENTS_WEIGHTS)


def load_element_delta(version_dir: Path) -> ElementDelta:
    """Read a version's element delta (only its own file); DeltaMismatch when it is missing, torn or altered."""
    from safetensors.torch import load_file

    info = read_element_delta(version_dir)
    if info is None:
        raise DeltaMismatch(f"{version_dir} was published without an element delta")
    if not info.path.is_file() or file_sha256(info.path) != info.sha256:
        raise DeltaMismatch(f"{info.path} does not match its sha256")
    meta = json.loads((version_dir / ELEMENTS_META).read_text())
    return from_tensors(load_file(str(info.path)), meta)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
