"""Issue 19: engine/trainer logprob mismatch, TIS/MIS importance correction, bounded staleness.

The pure parts on constructed tensors (weights, masks, gradients), then the learner and the
behaviour scorer on a real tiny Qwen2: rollout logprobs set to what a version's weights give must
measure no mismatch under that version, and a shifted logprob must show up as exactly that token.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from testkit.samples import random_sequence, sample_record
from trainer_consumer.batching import BatchBuilder
from trainer_consumer.behaviour import BehaviourScorer
from trainer_consumer.learner import Learner, LearnerConfig
from trainer_consumer.losses import LossConfig, importance_weights, per_token_loss
from trainer_consumer.mismatch import mismatch_stats
from trainer_consumer.sample_view import TrainSample
from trainer_consumer.settings import resolve_importance_sampling
from trainer_consumer.staleness import StalenessBound

from .helpers import VOCAB, decode_round_trip, make_tiny_model

NAN = float("nan")
# Trainer (behaviour) and engine (rollout) logprobs of five tokens; the last is off the loss mask.
BEHAVIOUR = torch.tensor([[-1.0, -1.0, -1.0, NAN, -1.0]])
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.1, -1.0, -1.0]])
MASK = torch.tensor([[True, True, True, True, False]])
# w = exp(behaviour - rollout): 1, e (2.718), exp(-0.9) (0.407), unknown, off the mask.
E, LOW = math.e, math.exp(-0.9)


def test_importance_weights_truncate_mask_and_leave_unknown_tokens_alone() -> None:
    tis = importance_weights(BEHAVIOUR, ROLLOUT, MASK, "tis", cap=2.0)
    assert torch.allclose(tis.weight, torch.tensor([[1.0, 2.0, LOW, 1.0, 1.0]]))
    assert tis.truncated.tolist() == [[False, True, False, False, False]]
    assert tis.known.tolist() == [[True, True, True, False, False]]
    mis = importance_weights(BEHAVIOUR, ROLLOUT, MASK, "mis", cap=2.0)  # masks w outside [0.5, 2]
    assert torch.allclose(mis.weight, torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0]]))
    assert mis.truncated.tolist() == [[False, True, True, False, False]]
    mis_wide = importance_weights(BEHAVIOUR, ROLLOUT, MASK, "mis", cap=3.0)  # [1/3, 3] keeps them all
    assert torch.allclose(mis_wide.weight, torch.tensor([[1.0, E, LOW, 1.0, 1.0]]))
    assert not mis_wide.truncated.any()
    none = importance_weights(BEHAVIOUR, ROLLOUT, MASK, "none", cap=2.0)
    assert torch.equal(none.weight, torch.ones_like(ROLLOUT)) and not none.truncated.any()
    assert none.known.tolist() == tis.known.tolist()


@pytest.mark.parametrize(("mode", "expected"), [("tis", [1.0, 2.0, LOW, 1.0, 0.0]),
                                                 ("mis", [1.0, 0.0, 0.0, 1.0, 0.0])])
def test_each_tokens_gradient_is_scaled_by_its_importance_weight(mode: str, expected: list[float]) -> None:
    # The current weights are the behaviour weights (the step's first forward): every PPO ratio is 1,
    # inside the clip, so d(loss)/d(logp) of a token is -w * A exactly.
    advantages = torch.tensor([[0.5, 0.5, -1.5, 2.0, 3.0]])
    batch = SimpleNamespace(loss_mask=MASK, rollout_logprobs=ROLLOUT, advantages=advantages)
    logp = torch.where(torch.isnan(BEHAVIOUR), ROLLOUT, BEHAVIOUR).requires_grad_(True)
    tl = per_token_loss(logp, batch, LossConfig(importance_sampling=mode, importance_cap=2.0),  # type: ignore[arg-type]
                        behaviour=BEHAVIOUR)
    tl.loss.sum().backward()
    assert logp.grad is not None
    assert torch.allclose(logp.grad, -torch.tensor([expected]) * advantages)
    assert torch.allclose(tl.ratio[MASK], torch.ones(4))


def test_without_a_correction_the_ratio_is_still_taken_against_the_engine() -> None:
    advantages = torch.ones(1, 5)
    batch = SimpleNamespace(loss_mask=MASK, rollout_logprobs=ROLLOUT, advantages=advantages)
    logp = torch.where(torch.isnan(BEHAVIOUR), ROLLOUT, BEHAVIOUR)
    plain = per_token_loss(logp, batch, LossConfig())  # type: ignore[arg-type]
    measured = per_token_loss(logp, batch, LossConfig(), behaviour=BEHAVIOUR)  # type: ignore[arg-type]
    assert torch.equal(plain.loss, measured.loss)
    assert plain.ratio[0, 1] == pytest.approx(E)  # exp(logp - rollout), clipped to 1.2 in the loss


def test_mismatch_stats_on_constructed_logprobs() -> None:
    trainer = torch.tensor([[-1.0, -1.5, -0.5, -3.0]])
    engine = torch.tensor([[-1.05, -1.0, -0.5, 0.0]])
    compared = torch.tensor([[True, True, True, False]])
    m = mismatch_stats(trainer, engine, compared, bound=0.2)
    assert m.tokens == 3 and m.beyond == 1
    assert m.mean_abs == pytest.approx(0.55 / 3) and m.max_abs == pytest.approx(0.5)
    assert m.beyond_fraction == pytest.approx(1 / 3)


def test_auto_importance_sampling_is_tis_behind_vllm_only() -> None:
    assert resolve_importance_sampling("auto", "vllm") == "tis"
    assert resolve_importance_sampling("auto", "embedded") == "none"
    assert resolve_importance_sampling("mis", "embedded") == "mis"
    with pytest.raises(ValueError):
        resolve_importance_sampling("sometimes", "vllm")


# ---------------------------------------------------------------- staleness


def _sample(version: int, seed: int = 0, output_len: int = 3) -> TrainSample:
    rng = np.random.default_rng(seed)
    return decode_round_trip(sample_record([random_sequence(rng, VOCAB, 4, output_len, f"r{seed}", advantage=1.0)],
                                           policy_version=version))


def test_stale_tokens_are_dropped_or_masked_by_rule_with_per_token_versions() -> None:
    sample = _sample(9)  # 4 prompt tokens, 3 sampled ones
    versions = np.array([1, 1, 1, 1, 8, 7, 9])  # the prompt's versions do not matter: no loss on it
    drop = StalenessBound(2, "drop").apply(sample, current_version=10, versions=versions)
    assert drop.sample is None and drop.stale_tokens == 1
    mask = StalenessBound(2, "mask").apply(sample, current_version=10, versions=versions)
    assert mask.sample is not None and (mask.stale_tokens, mask.masked_tokens) == (1, 1)
    assert mask.sample.weights.tolist() == [0, 0, 0, 0, 1, 0, 1]
    assert np.array_equal(mask.sample.loss_mask, sample.loss_mask)  # still traceable, just weightless
    all_stale = StalenessBound(2, "mask").apply(sample, current_version=10, versions=np.full(7, 7))
    assert all_stale.sample is None and all_stale.stale_tokens == 3
    # Without per-token versions every token has the sample's (first) version.
    assert StalenessBound(2, "drop").apply(_sample(7), current_version=10).sample is None
    assert StalenessBound(2, "drop").apply(_sample(8), current_version=10).sample is not None
    with pytest.raises(ValueError):
        StalenessBound(2, "hold")  # type: ignore[arg-type]


def test_the_batch_names_dropped_samples_and_counts_masked_tokens() -> None:
    fresh, old = _sample(9, seed=1), _sample(6, seed=2)
    dropping: BatchBuilder[int] = BatchBuilder(batch_size=4, staleness=StalenessBound(2, "drop"))
    assert [dropping.add(s, i, 10) for i, s in enumerate([fresh, old])] == [None, "stale"]
    batch = dropping.take()
    assert batch.sample_ids == [fresh.sample_id] and batch.stale_dropped_ids == [old.sample_id]
    assert batch.filtered == {"stale": 1} and batch.positions == [0, 1]
    masking: BatchBuilder[int] = BatchBuilder(batch_size=4, staleness=StalenessBound(2, "mask"))
    # One version per sample: "mask" takes every loss token of a stale sample, so it is dropped too.
    assert [masking.add(s, i, 10) for i, s in enumerate([fresh, old])] == [None, "stale"]
    assert masking.take().stale_masked_tokens == 0


# ---------------------------------------------------------------- learner + behaviour scorer


def _with_engine_logprobs(samples: list[TrainSample], model: Any, shift: dict[int, float] | None = None
                          ) -> list[TrainSample]:
    """The samples with rollout logprobs as ``model`` gives them (an engine exactly like the trainer),
    the first sample's loss tokens at the positions in ``shift`` moved by the given amount."""
    scorer = Learner(model, LearnerConfig())
    out = []
    for i, s in enumerate(samples):
        lp = scorer.sample_logprobs([s]).numpy().astype(np.float32)
        lp = np.where(s.loss_mask != 0, lp, np.float32(np.nan))
        if i == 0:
            loss_positions = np.flatnonzero(s.loss_mask)
            for k, delta in (shift or {}).items():
                lp[loss_positions[k]] += delta
        out.append(dataclasses.replace(s, rollout_logprobs=lp))
    return out


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_mismatch_is_measured_under_each_samples_behaviour_version(make_samples, layout: str) -> None:
    old_model, current_model = make_tiny_model(seed=1), make_tiny_model(seed=2)  # versions 3 and 4
    old = _with_engine_logprobs(make_samples(3, seed=5, policy_version=3), old_model, shift={0: 1.0})
    current = _with_engine_logprobs(make_samples(3, seed=6, policy_version=4), current_model)
    lost = make_samples(2, seed=7, policy_version=1)  # version 1 is not in the store: not compared
    loads: list[int] = []

    def load(version: int) -> dict[str, torch.Tensor]:
        loads.append(version)
        if version != 3:
            raise LookupError(f"version {version} is not published")
        return old_model.state_dict()

    cfg = LearnerConfig(layout=layout, micro_batch_tokens=40, mismatch_bound=0.2,  # type: ignore[arg-type]
                        loss=LossConfig(importance_sampling="tis", importance_cap=2.0))
    learner = Learner(current_model, cfg)
    scorer = BehaviourScorer(current_model, load, cache_versions=2, layout=layout, micro_batch_tokens=40)
    samples = [*old, *current, *lost]
    behaviour = scorer.behaviour(samples, forward_version=4)
    assert behaviour.from_forward == {s.sample_id for s in current}
    assert set(behaviour.recomputed) == {s.sample_id for s in old}
    assert behaviour.unknown == {s.sample_id for s in lost}
    result = learner.step(samples, behaviour)

    compared = sum(int(np.count_nonzero(s.loss_mask)) for s in [*old, *current])
    m = result.mismatch
    assert m.tokens == compared and result.stats.importance_tokens == compared
    assert m.beyond == 1 and m.max_abs == pytest.approx(1.0, abs=1e-4)  # the one shifted token
    assert m.abs_sum == pytest.approx(1.0, abs=1e-3)  # every other token agrees
    # exp(behaviour - rollout) = exp(-1) for the shifted token: inside TIS's cap, nothing truncated.
    assert result.stats.importance_truncated == 0
    # Each version's weights are read once; a second batch at those versions comes from the cache.
    scorer.behaviour(old, forward_version=4)
    assert loads == [1, 3] and scorer.loads == 1


def test_tis_counts_the_tokens_it_truncates(make_samples) -> None:
    model = make_tiny_model(seed=3)
    samples = _with_engine_logprobs(make_samples(2, seed=8, policy_version=0), model, shift={0: -2.0, 1: -0.1})
    learner = Learner(model, LearnerConfig(loss=LossConfig(importance_sampling="tis", importance_cap=2.0)))
    scorer = BehaviourScorer(model, lambda v: model.state_dict(), cache_versions=0)
    result = learner.step(samples, scorer.behaviour(samples, forward_version=0))
    # w = exp(2) > 2 is truncated, exp(0.1) is not; only the first |delta| is beyond the 0.2 bound.
    assert result.stats.importance_truncated == 1
    assert result.mismatch.beyond == 1 and result.mismatch.max_abs == pytest.approx(2.0, abs=1e-4)
    assert result.stats.importance_tokens == sum(int(np.count_nonzero(s.loss_mask)) for s in samples)


def test_a_sample_across_a_weight_update_is_scored_per_token_under_each_version(make_samples) -> None:
    """Loss tokens sampled by versions 3 and 4 (Sample.version_spans): each takes its own version's logprob."""
    v3, v4 = make_tiny_model(seed=1), make_tiny_model(seed=2)
    [base] = make_samples(1, seed=11, policy_version=3, lengths=[(5, 8)])  # 5 prompt tokens, 8 sampled
    cut = 9  # tokens 5..8 by version 3 (the sample's first version, outside every span), 9..12 by version 4
    sample = dataclasses.replace(base, policy_version_last=4, version_spans=((4, cut, base.num_tokens),))
    loss = sample.loss_mask != 0
    by_v3, by_v4 = (Learner(m, LearnerConfig()).sample_logprobs([sample]).numpy() for m in (v3, v4))
    states = {3: v3.state_dict(), 4: v4.state_dict()}

    def load(version: int) -> dict[str, torch.Tensor]:
        if version not in states:
            raise LookupError(f"version {version} is not published")
        return states[version]

    scorer = BehaviourScorer(make_tiny_model(seed=3), load, layout="padded")
    behaviour = scorer.behaviour([sample], forward_version=5)
    got = behaviour.recomputed[sample.sample_id]
    early, late = loss & (np.arange(sample.num_tokens) < cut), loss & (np.arange(sample.num_tokens) >= cut)
    assert np.allclose(got[early], by_v3[early], atol=1e-5) and np.allclose(got[late], by_v4[late], atol=1e-5)
    assert not np.allclose(by_v3[late], by_v4[late], atol=1e-3)  # the two versions really differ there
    assert scorer.loads == 2 and not behaviour.unknown and not behaviour.from_forward
    # Version 4 pruned from the store: its tokens are unknown (NaN), version 3's are still compared.
    del states[4]
    partial = BehaviourScorer(make_tiny_model(seed=3), load).behaviour([sample], forward_version=5)
    got = partial.recomputed[sample.sample_id]
    assert np.isnan(got[late]).all() and np.allclose(got[early], by_v3[early], atol=1e-5)
    assert not partial.unknown
