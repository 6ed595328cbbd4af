"""Published policy weights on disk, shared by the trainer (publishes) and the engines (load).

Layout under the store root (settings.trainer.checkpoint_dir):

    <version>/model.safetensors   the full state dict
    <version>/policy.json         version, sha256 of the weights, creation time, metadata
    latest                        the newest published version, as text

A version directory appears atomically (written in a temporary sibling, fsynced, renamed), and
``latest`` is replaced atomically after it, so a reader never sees a partial policy. Publishing the
same version twice is allowed only with identical weights (a trainer that crashed after publishing
and replays its step); ``latest`` only moves forward.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

WEIGHTS_FILE = "model.safetensors"
META_FILE = "policy.json"
LATEST_FILE = "latest"


class PolicyStoreError(RuntimeError):
    pass


@dataclass(frozen=True)
class PolicyInfo:
    version: int
    path: Path  # the version directory
    sha256: str
    created_at: float
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def weights_path(self) -> Path:
        return self.path / WEIGHTS_FILE


class PolicyStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        # The last version this store published with a delta, as the engine holds it (its dtype, its tensors'
        # digests): the next element delta's base without hashing it again.
        self._last_served: tuple[int, torch.dtype, dict[str, str]] | None = None

    def path(self, version: int) -> Path:
        return self.root / str(int(version))

    def versions(self) -> list[int]:
        if not self.root.is_dir():
            return []
        found = [int(p.name) for p in self.root.iterdir() if p.name.isdigit() and (p / META_FILE).is_file()]
        return sorted(found)

    def latest_version(self) -> int | None:
        try:
            text = (self.root / LATEST_FILE).read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text.isdigit() else None

    def info(self, version: int) -> PolicyInfo:
        directory = self.path(version)
        try:
            meta = json.loads((directory / META_FILE).read_text())
        except FileNotFoundError:
            raise PolicyStoreError(f"policy version {version} is not published in {self.root}") from None
        return PolicyInfo(int(meta["version"]), directory, meta["sha256"], float(meta["created_at"]),
                          dict(meta.get("metadata", {})))

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor],
                metadata: Mapping[str, Any] | None = None, delta: bool = False,
                engine_dtype: torch.dtype = torch.float32) -> PolicyInfo:
        """Write ``state_dict`` as policy ``version`` and point ``latest`` at it (if it is newer). ``delta``: also
        write what changed since the latest published version (``models.policy_delta``: the changed weight
        groups, and the changed elements in ``engine_dtype``, the dtype the engines serve: float32 for the
        reference model's engines, bfloat16 for a bf16 vLLM), for engines that hold that version; skipped when
        there is none or the change is not a delta (shapes, names). The full checkpoint keeps the trainer's
        dtype (the trainer resumes from it; an engine casts it as it loads, the same cast the delta uses)."""
        from safetensors.torch import save_file

        if version < 0:
            raise PolicyStoreError("policy versions are non-negative integers")
        self.root.mkdir(parents=True, exist_ok=True)
        # Own, contiguous copies: safetensors refuses shared or strided storage.
        tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in state_dict.items()}
        staging = Path(tempfile.mkdtemp(prefix=f".publish-{version}-", dir=self.root))
        try:
            weights = staging / WEIGHTS_FILE
            save_file(tensors, str(weights), metadata={"tokentrail_policy_version": str(version)})
            digest = _sha256(weights)
            meta = {"version": version, "sha256": digest, "created_at": time.time(),
                    "metadata": dict(metadata or {})}
            (staging / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            served = self._write_delta(staging, version, tensors, engine_dtype) if delta else None
            _fsync_dir_files(staging)
            target = self.path(version)
            if target.exists():
                existing = self.info(version)
                if existing.sha256 != digest:
                    raise PolicyStoreError(f"policy version {version} already exists with other weights")
                info = existing
            else:
                staging.rename(target)
                _fsync(self.root)
                info = self.info(version)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        if served is not None:
            self._last_served = (version, engine_dtype, served)
        self._advance_latest(version)
        return info

    def _write_delta(self, staging: Path, version: int, tensors: Mapping[str, torch.Tensor],
                     engine_dtype: torch.dtype) -> dict[str, str]:
        """Write the deltas into ``staging``; returns the digests of the version's tensors as the engine holds
        them (each tensor hashed once: an unchanged one keeps its base's digest)."""
        from models.element_delta import Mirror, cast_state, plan_element_delta
        from models.policy_delta import plan_delta, write_delta, write_element_delta

        base = self.latest_version()
        if base is None or base >= version:
            return dict(Mirror.of(cast_state(tensors, engine_dtype)).digests)
        previous = self.load_state_dict(base, verify=False)
        plan = plan_delta(previous, tensors)
        if plan is not None:
            write_delta(staging, plan, tensors, base, self.info(base).sha256)
        cached = self._last_served
        known = cached[2] if cached is not None and cached[:2] == (base, engine_dtype) else None
        if known is None or known.keys() != tensors.keys():
            known = dict(Mirror.of(cast_state(previous, engine_dtype)).digests)
        elements = plan_element_delta(previous, tensors, engine_dtype, previous_digests=known)
        if elements is None:
            return dict(Mirror.of(cast_state(tensors, engine_dtype)).digests)
        write_element_delta(staging, elements, base)
        return {**known, **{item.name: item.sha256 for item in elements.tensors}}

    def load_state_dict(self, version: int, verify: bool = True) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        info = self.info(version)
        if verify and _sha256(info.weights_path) != info.sha256:
            raise PolicyStoreError(f"policy version {version}: weights do not match their sha256")
        return load_file(str(info.weights_path))

    def prune(self, keep_last: int) -> list[int]:
        """Delete all but the newest ``keep_last`` versions (never the one ``latest`` names)."""
        latest = self.latest_version()
        versions = self.versions()
        doomed = [v for v in versions[: max(0, len(versions) - keep_last)] if v != latest]
        for version in doomed:
            shutil.rmtree(self.path(version), ignore_errors=True)
        return doomed

    def _advance_latest(self, version: int) -> None:
        current = self.latest_version()
        if current is not None and current >= version:
            return
        fd, tmp = tempfile.mkstemp(prefix=".latest-", dir=self.root)
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{version}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.root / LATEST_FILE)
        _fsync(self.root)


def load_weights_dir(weights_dir: Path) -> dict[str, torch.Tensor]:
    """The state dict in a policy version directory (or a model directory) ``weights_dir``."""
    from safetensors.torch import load_file

    path = Path(weights_dir)
    path = path / WEIGHTS_FILE if path.is_dir() else path
    if not path.is_file():
        raise PolicyStoreError(f"no {WEIGHTS_FILE} in {weights_dir}")
    return load_file(str(path))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir_files(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_dir():  # the version's delta (models/policy_delta.py)
            _fsync_dir_files(path)
            continue
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    _fsync(directory)
