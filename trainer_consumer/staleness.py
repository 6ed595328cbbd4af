"""Bounded staleness: which loss tokens were sampled by a policy too far behind the trainer, and what
to do with a sample that has them.

Pure: no Kafka, no model. A token is stale when the version that sampled it is older than
``current_version - max_staleness``. Two rules, chosen by ``trainer.stale_rule``:

- ``drop``: a sample with any stale loss token is not trained on; the batch records its id (the
  TrainerStep's ``stale_dropped_ids``) and counts it under the ``stale`` filter reason.
- ``mask``: only the stale tokens lose their loss weight (weight 0, loss mask kept so the tokens stay
  traceable); the sample is dropped as under ``drop`` when no loss token is left. The masked count
  travels on the TrainerStep (``stale_masked_tokens``). With one version per sample both rules agree;
  they differ once a sample carries per-token versions (a call whose tokens span a weight update).

Versions are per token: a sample's ``version_spans`` (``Sample.version_spans``) say which version
sampled each loss token where that is not ``policy_version_first`` (calls of several versions merged or
packed, or a call whose tokens span a weight update); every other token is given
``policy_version_first``. ``token_versions`` is the one place that reads them.

Where the bound comes from, end to end: ``DEFAULT_MAX_STALENESS`` here is the one default;
``TrainerSettings.max_staleness`` / ``stale_rule`` (``TOKENTRAIL_TRAINER__MAX_STALENESS``, the ``trainer``
section) hold the configured values; ``FilterConfig.from_settings`` is the one merge, where a
``tokentrail train --max-staleness/--stale-rule`` flag given wins over the section (``run_training`` calls
it without flags when no ``FilterConfig`` is passed in); ``FilterConfig.staleness()`` makes the
``StalenessBound`` below, which ``BatchBuilder(staleness=...)`` applies to every sample; each TrainerStep
records the bound it trained under (``OffPolicySettings``: ``max_staleness``, ``stale_rule``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from trainer_consumer.sample_view import TrainSample

StaleRule = Literal["drop", "mask"]
STALE_RULES: tuple[str, ...] = ("drop", "mask")
# Versions a loss token may lag the trainer: tokens four updates old still train (asynchronous rollouts
# run a few versions behind), older ones are dropped or masked.
DEFAULT_MAX_STALENESS = 4


def token_versions(sample: TrainSample) -> npt.NDArray[np.int64]:
    """The policy version that sampled each token of ``sample``: its version spans, and its first
    version outside them (tokens nobody sampled, and every token of a one-version sample)."""
    versions = np.full(sample.num_tokens, sample.policy_version_first, dtype=np.int64)
    for version, start, end in sample.version_spans:  # one entry per span, not per token
        if not 0 <= start < end <= sample.num_tokens:
            raise ValueError(f"sample {sample.sample_id}: version span {start}..{end} outside its "
                             f"{sample.num_tokens} tokens")
        versions[start:end] = version
    return versions


def stale_loss_tokens(versions: npt.NDArray[np.int64], loss_mask: npt.NDArray[np.uint8],
                      current_version: int, max_staleness: int) -> npt.NDArray[np.bool_]:
    """Loss tokens sampled by a version more than ``max_staleness`` behind ``current_version``."""
    return (loss_mask != 0) & (versions < current_version - max_staleness)


@dataclass(frozen=True)
class StaleOutcome:
    sample: TrainSample | None  # None: dropped; otherwise the sample to train (masked under "mask")
    stale_tokens: int  # loss tokens beyond the bound
    masked_tokens: int  # of those, how many lost their weight in a kept sample


@dataclass(frozen=True)
class StalenessBound:
    max_staleness: int
    rule: StaleRule = "drop"

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        if self.rule not in STALE_RULES:
            raise ValueError(f"unknown stale rule {self.rule!r}; expected one of {STALE_RULES}")

    def apply(self, sample: TrainSample, current_version: int,
              versions: npt.NDArray[np.int64] | None = None) -> StaleOutcome:
        """The sample as it may be trained at ``current_version``; ``versions`` per token (default:
        ``token_versions(sample)``)."""
        if current_version - sample.policy_version_first <= self.max_staleness and versions is None:
            return StaleOutcome(sample, 0, 0)  # the common case: nothing is old enough to look at
        per_token = token_versions(sample) if versions is None else versions
        if per_token.shape[0] != sample.num_tokens:
            raise ValueError(f"{per_token.shape[0]} token versions for {sample.num_tokens} tokens")
        stale = stale_loss_tokens(per_token, sample.loss_mask, current_version, self.max_staleness)
        n_stale = int(np.count_nonzero(stale))
        if n_stale == 0:
            return StaleOutcome(sample, 0, 0)
        if self.rule == "drop":
            return StaleOutcome(None, n_stale, 0)
        weights = np.where(stale, np.float32(0), sample.weights).astype(np.float32)
        if np.count_nonzero((weights > 0) & (sample.loss_mask != 0)) == 0:
            return StaleOutcome(None, n_stale, 0)
        return StaleOutcome(dataclasses.replace(sample, weights=weights), n_stale, n_stale)
