"""The trainer's log-probabilities of sampled tokens under the weights that sampled them.

Each sample records the policy version that produced it (the behaviour version). For the samples
whose version is the trainer's weights before the step, the step's own forward pass gives these
logprobs for free (``BehaviourLogprobs.from_forward``: the learner reads them off that pass). For
older versions, ``BehaviourScorer`` loads that version's weights into a scratch copy of the model
(a bounded LRU of state dicts, so a batch spread over a few versions loads each once) and scores
the samples without gradients. A sample whose loss tokens were sampled by several versions (its
version spans: calls of several versions, or a call across a weight update) is scored under each of
them, every token taking the logprob of its own version (``staleness.token_versions``): one extra
forward per version for those samples only, which are rare. A version the store no longer holds stays
unknown: its tokens (NaN) are neither compared nor corrected.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from trainer_consumer.collate import Layout, collate, split_micro_batches
from trainer_consumer.losses import token_logprobs
from trainer_consumer.sample_view import TrainSample
from trainer_consumer.staleness import token_versions

StateDictLoader = Callable[[int], Mapping[str, torch.Tensor]]


@dataclass(frozen=True)
class BehaviourLogprobs:
    """Per sample of a step: where its behaviour logprobs come from."""

    recomputed: Mapping[str, npt.NDArray[np.float32]] = field(default_factory=dict)  # id -> per token
    from_forward: frozenset[str] = frozenset()  # ids whose behaviour weights are the step's weights
    unknown: frozenset[str] = frozenset()  # ids whose behaviour logprobs could not be had

    def flat(self, samples: Sequence[TrainSample]) -> tuple[torch.Tensor, torch.Tensor]:
        """(recomputed logprobs, NaN elsewhere; bool: take the value from the step's forward), both
        flat over ``samples``' tokens in order."""
        values = np.concatenate([
            self.recomputed[s.sample_id] if s.sample_id in self.recomputed
            else np.full(s.num_tokens, np.nan, dtype=np.float32) for s in samples])
        reuse = np.concatenate([np.full(s.num_tokens, s.sample_id in self.from_forward) for s in samples])
        return torch.from_numpy(values.astype(np.float32, copy=False)), torch.from_numpy(reuse)


def behaviour_version(sample: TrainSample) -> int | None:
    """The one version that sampled every token of ``sample``, or None when it spans several."""
    first, last = sample.policy_version_first, sample.policy_version_last
    return first if first == last else None


class BehaviourScorer:
    """Scores samples under their behaviour versions' weights (a scratch model, cached state dicts)."""

    def __init__(self, model: Any, load: StateDictLoader, cache_versions: int = 2, layout: Layout = "padded",
                 pad_id: int = 0, micro_batch_tokens: int | None = 8192) -> None:
        self.scratch = copy.deepcopy(model).eval() if cache_versions > 0 else None
        self.load = load
        self.cache_versions = cache_versions
        self.layout = layout
        self.pad_id = pad_id
        self.micro_batch_tokens = micro_batch_tokens
        self._cache: OrderedDict[int, Mapping[str, torch.Tensor]] = OrderedDict()
        self._loaded: int | None = None  # the version now in the scratch model
        self.loads = 0  # state dicts read from the store (for tests and progress)

    def _weights(self, version: int) -> Mapping[str, torch.Tensor] | None:
        if version in self._cache:
            self._cache.move_to_end(version)
            return self._cache[version]
        try:
            state = self.load(version)
        except (FileNotFoundError, KeyError, LookupError, OSError, ValueError):
            return None  # pruned or never published: the version's tokens stay unknown
        self.loads += 1
        self._cache[version] = state
        while len(self._cache) > self.cache_versions:
            self._cache.popitem(last=False)
        return state

    @torch.no_grad()
    def _score(self, samples: Sequence[TrainSample]) -> dict[str, npt.NDArray[np.float32]]:
        assert self.scratch is not None
        out: dict[str, npt.NDArray[np.float32]] = {}
        for part in split_micro_batches(samples, self.micro_batch_tokens):
            batch = collate(part, self.layout, pad_id=self.pad_id)
            flat = batch.flat_tokens(token_logprobs(self.scratch, batch)).numpy().astype(np.float32)
            start = 0
            for s in part:
                out[s.sample_id] = flat[start:start + s.num_tokens]
                start += s.num_tokens
        return out

    def behaviour(self, samples: Sequence[TrainSample], forward_version: int | None) -> BehaviourLogprobs:
        """Behaviour logprobs for a step whose weights before it are ``forward_version`` (None: weights
        no published version holds, e.g. updates not yet published with ``steps_per_version`` > 1)."""
        by_version: dict[int, list[TrainSample]] = {}
        from_forward: set[str] = set()
        unknown: set[str] = set()
        mixed: dict[str, npt.NDArray[np.int64]] = {}  # id -> per-token versions, for several-version samples
        for s in samples:
            v = behaviour_version(s)
            if v is not None and v == forward_version:
                from_forward.add(s.sample_id)
            elif self.scratch is None:
                unknown.add(s.sample_id)
            elif v is not None:
                by_version.setdefault(v, []).append(s)
            else:
                mixed[s.sample_id] = versions = token_versions(s)
                for version in np.unique(versions[s.loss_mask != 0]).tolist():
                    by_version.setdefault(int(version), []).append(s)
        recomputed: dict[str, npt.NDArray[np.float32]] = {}
        for version, group in sorted(by_version.items()):
            state = self._weights(version)
            if state is None:
                unknown.update(s.sample_id for s in group if s.sample_id not in mixed)
                continue
            if self._loaded != version:
                assert self.scratch is not None
                self.scratch.load_state_dict(state, strict=True)
                self._loaded = version
            for sample_id, scored in self._score(group).items():
                if sample_id not in mixed:
                    recomputed[sample_id] = scored
                    continue
                own = mixed[sample_id] == version  # the tokens this version sampled
                so_far = recomputed.get(sample_id, np.full(own.shape[0], np.nan, dtype=np.float32))
                recomputed[sample_id] = np.where(own, scored, so_far).astype(np.float32)
        # A several-version sample none of whose versions could be loaded is unknown as a whole.
        unknown.update(i for i in mixed if i not in recomputed)
        return BehaviourLogprobs(recomputed, frozenset(from_forward), frozenset(unknown))
