"""The policy store the trainer publishes to and the engines load from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.policy_store import LATEST_FILE, PolicyStore, PolicyStoreError, load_weights_dir


def _state(value: float) -> dict[str, torch.Tensor]:
    shared = torch.full((3, 2), value)
    return {"a.weight": shared, "b.weight": shared, "c.bias": torch.arange(4.0)[::2]}  # shared + strided


def test_publish_then_load_round_trips(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path)
    assert store.latest_version() is None and store.versions() == []
    info = store.publish(1, _state(1.0), {"trainer_step": 10})
    assert info.version == 1 and info.metadata == {"trainer_step": 10} and info.weights_path.is_file()
    loaded = store.load_state_dict(1)
    assert torch.equal(loaded["a.weight"], torch.full((3, 2), 1.0))
    assert torch.equal(loaded["c.bias"], torch.tensor([0.0, 2.0]))
    assert torch.equal(load_weights_dir(store.path(1))["b.weight"], loaded["b.weight"])
    assert store.latest_version() == 1 and (tmp_path / LATEST_FILE).read_text() == "1\n"


def test_latest_only_moves_forward_and_republish_is_idempotent(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path)
    store.publish(2, _state(2.0))
    store.publish(1, _state(1.0))  # a late, older version is stored but does not become latest
    assert store.latest_version() == 2 and store.versions() == [1, 2]
    again = store.publish(2, _state(2.0))  # a trainer replaying its publish after a crash
    assert again.sha256 == store.info(2).sha256
    with pytest.raises(PolicyStoreError, match="other weights"):
        store.publish(2, _state(3.0))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_corrupted_weights_are_detected(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path)
    info = store.publish(1, _state(1.0))
    data = bytearray(info.weights_path.read_bytes())
    data[-1] ^= 0xFF
    info.weights_path.write_bytes(bytes(data))
    with pytest.raises(PolicyStoreError, match="sha256"):
        store.load_state_dict(1)
    with pytest.raises(PolicyStoreError, match="not published"):
        store.info(9)


def test_prune_keeps_the_newest_and_latest(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path)
    for version in range(5):
        store.publish(version, _state(float(version)))
    assert store.prune(keep_last=2) == [0, 1, 2]
    assert store.versions() == [3, 4] and store.latest_version() == 4
