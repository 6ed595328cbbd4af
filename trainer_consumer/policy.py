"""The trainer's policy: load the newest published weights (or the base model) and publish new ones.

The base model (settings.model.dir, built by ``models.reference.build``) is policy version 0. Every
published version lives in ``models.policy_store`` under settings.trainer.checkpoint_dir; the
embedded engine hot-loads ``latest`` from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.policy_store import PolicyStore, PolicyStoreError

BASE_VERSION = 0


@dataclass(frozen=True)
class LoadedPolicy:
    model: Any
    version: int
    step: int  # the step recorded with that version by the run that published it (0 otherwise)
    pad_id: int
    metadata: dict[str, Any]  # what this run stored with the version ({} for another run's)


def load_policy(model_dir: Path, store: PolicyStore, run_id: str, build_if_missing: bool = True,
                progress: Any = None) -> LoadedPolicy:
    """The base model from ``model_dir`` with the latest published weights on top, if any."""
    import torch
    from transformers import AutoModelForCausalLM

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        if not build_if_missing:
            raise FileNotFoundError(f"no model in {model_dir}; run `tokentrail model build`")
        from models.reference.build import build_model

        build_model(model_dir, progress=progress or (lambda _m: None))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    version, step, metadata = BASE_VERSION, 0, {}
    latest = store.latest_version()
    if latest is not None:
        model.load_state_dict(store.load_state_dict(latest), strict=True)
        info = store.info(latest)
        version = latest
        if info.metadata.get("run_id") == run_id:
            step = int(info.metadata.get("step", 0))
            metadata = info.metadata
    model.eval()
    pad_id = model.config.pad_token_id
    return LoadedPolicy(model=model, version=version, step=step,
                        pad_id=int(pad_id) if pad_id is not None else 0, metadata=metadata)


class StorePublisher:
    """Publishes the model's weights as a new version in the policy store."""

    def __init__(self, store: PolicyStore, delta: bool = False, engine_dtype: str = "float32") -> None:
        self.store = store
        self.delta = delta  # also publish what changed since the last version (models/policy_delta.py)
        self.engine_dtype = engine_dtype  # what the engines serve: the dtype the element delta is in

    @classmethod
    def from_settings(cls, store: PolicyStore, settings: Any) -> StorePublisher:
        """The trainer's publisher: with the deltas ``settings`` (the ``trainer`` section) asks for, in its
        ``engine_dtype`` (on by default: what the default ``weight_sync.transfer`` scatters)."""
        return cls(store, settings.publish_delta, settings.engine_dtype)

    def publish(self, model: Any, version: int, metadata: dict[str, Any]) -> None:
        import torch

        self.store.publish(version, model.state_dict(), metadata, delta=self.delta,
                           engine_dtype=getattr(torch, self.engine_dtype))


def state_dict_loader(model_dir: Path, store: PolicyStore) -> Any:
    """Loads a policy version's weights (0: the base model's) for recomputing behaviour logprobs;
    a version the store does not hold raises LookupError."""

    def load(version: int) -> dict[str, Any]:
        if version == BASE_VERSION:
            import torch
            from transformers import AutoModelForCausalLM

            return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
        try:
            return store.load_state_dict(version)
        except PolicyStoreError as exc:
            raise LookupError(str(exc)) from exc

    return load
