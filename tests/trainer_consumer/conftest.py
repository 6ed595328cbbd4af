from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from testkit.samples import SequenceSpec, random_sequence, sample_record
from trainer_consumer.sample_view import TrainSample

from .helpers import VOCAB, decode_round_trip, make_tiny_model


@pytest.fixture
def tiny_model() -> Any:
    return make_tiny_model()


@pytest.fixture
def make_samples() -> Callable[..., list[TrainSample]]:
    """``count`` decoded samples packing ``pack`` random sequences each."""

    def make(count: int, pack: int = 1, seed: int = 0, policy_version: int = 0,
             lengths: Sequence[tuple[int, int]] | None = None) -> list[TrainSample]:
        rng = np.random.default_rng(seed)
        out = []
        for i in range(count):
            seqs: list[SequenceSpec] = []
            for j in range(pack):
                p, o = lengths[(i * pack + j) % len(lengths)] if lengths else (
                    int(rng.integers(3, 12)), int(rng.integers(1, 10)))
                seqs.append(random_sequence(rng, VOCAB, p, o, rollout_id=f"r{i}-{j}",
                                            weight=float(rng.uniform(0.5, 2.0))))
            out.append(decode_round_trip(sample_record(seqs, policy_version=policy_version)))
        return out

    return make
