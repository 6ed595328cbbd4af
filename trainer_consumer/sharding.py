"""How one global step's samples are shared among ranks: pure, deterministic, balanced by tokens.

Every rank's forward/backward costs about its token count, so the split balances tokens: longest
sample first to the rank with the fewest tokens so far (ties: the lower rank), then each share keeps
the batch's order. A step with fewer samples than ranks leaves some ranks an empty share: they still
join the step (a zero contribution to the summed gradient), so the ranks stay in lock-step.

The loss of every share is divided by the denominator of the WHOLE step (``losses.loss_denominator``
over all samples), so the gradients summed across ranks equal the one-process gradient of the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from trainer_consumer.behaviour import BehaviourLogprobs
from trainer_consumer.sample_view import TrainSample


def shard_samples(samples: Sequence[TrainSample], world_size: int) -> list[list[TrainSample]]:
    """``world_size`` shares of ``samples`` (some may be empty), every sample in exactly one."""
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    load = [0] * world_size
    owner: list[int] = [0] * len(samples)
    # Longest first; equal lengths keep batch order (sorted is stable), so the split is deterministic.
    for i in sorted(range(len(samples)), key=lambda i: -samples[i].num_tokens):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += samples[i].num_tokens
    shares: list[list[TrainSample]] = [[] for _ in range(world_size)]
    for i, sample in enumerate(samples):
        shares[owner[i]].append(sample)
    return shares


def restrict_behaviour(behaviour: BehaviourLogprobs | None,
                       share: Sequence[TrainSample]) -> BehaviourLogprobs | None:
    """The part of a step's behaviour logprobs that one share needs (what travels to its rank)."""
    if behaviour is None:
        return None
    ids = {s.sample_id for s in share}
    recomputed: Mapping[str, npt.NDArray[np.float32]] = {
        k: v for k, v in behaviour.recomputed.items() if k in ids}
    return BehaviourLogprobs(recomputed=recomputed, from_forward=behaviour.from_forward & ids,
                             unknown=behaviour.unknown & ids)


@dataclass(frozen=True)
class StepShare:
    """What one rank receives for one global step: its samples, their behaviour logprobs and the step's
    global loss denominator. ``step`` numbers the orders so a rank that missed one notices."""

    step: int
    samples: list[TrainSample]
    denominator: float
    behaviour: BehaviourLogprobs | None = None
    sample_ids_all: tuple[str, ...] = field(default=())  # the whole step's ids (for a rank's own records)
    resync: bool = False  # rank 0's weights were replaced since the last step: take them before this one


def step_shares(step: int, samples: Sequence[TrainSample], world_size: int, denominator: float,
                behaviour: BehaviourLogprobs | None = None, resync: bool = False) -> list[StepShare]:
    """One ``StepShare`` per rank for a global step."""
    ids = tuple(s.sample_id for s in samples)
    return [StepShare(step, share, denominator, restrict_behaviour(behaviour, share), ids, resync)
            for share in shard_samples(samples, world_size)]


def sample_ranks(shares: Sequence[StepShare]) -> dict[str, int]:
    """sample id -> the rank that trained it."""
    return {s.sample_id: rank for rank, share in enumerate(shares) for s in share.samples}
