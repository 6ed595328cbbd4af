from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from testkit.samples import SequenceSpec, random_sequence, sample_record
from trainer_consumer.collate import collate
from trainer_consumer.learner import Learner, LearnerConfig
from trainer_consumer.losses import (
    LossConfig,
    loss_denominator,
    per_token_loss,
    policy_loss,
    token_logprobs,
)

from .helpers import VOCAB, decode_round_trip, make_tiny_model


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("normalization", ["weight", "tokens", "samples"])
def test_micro_batch_split_gives_the_same_gradient(make_samples, layout, normalization) -> None:
    samples = make_samples(7, pack=2, seed=11)
    loss_cfg = LossConfig(normalization=normalization)
    whole = Learner(make_tiny_model(), LearnerConfig(layout=layout, micro_batch_tokens=None, loss=loss_cfg))
    split = Learner(make_tiny_model(), LearnerConfig(layout=layout, micro_batch_tokens=40, loss=loss_cfg))
    stats_whole, n_whole = whole.accumulate_gradients(samples)
    stats_split, n_split = split.accumulate_gradients(samples)
    assert n_whole == 1 and n_split >= 3
    assert stats_whole.loss == pytest.approx(stats_split.loss, rel=1e-5, abs=1e-7)
    assert stats_whole.tokens == stats_split.tokens
    for a, b in zip(_grads(whole.model), _grads(split.model), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def test_per_micro_batch_mean_would_differ(make_samples) -> None:
    """The control: normalizing each micro-batch by its own weight changes the gradient."""
    samples = make_samples(6, seed=2, lengths=[(4, 2), (6, 9)])
    model = make_tiny_model()
    cfg = LossConfig()
    model.zero_grad()
    for part in (samples[:2], samples[2:]):
        batch = collate(part)
        loss, _ = policy_loss(token_logprobs(model, batch), batch, loss_denominator(part), cfg)
        loss.backward()
    local = _grads(model)
    model.zero_grad()
    batch = collate(samples)
    loss, _ = policy_loss(token_logprobs(model, batch), batch, loss_denominator(samples), cfg)
    loss.backward()
    assert not all(torch.allclose(a, b, rtol=1e-3) for a, b in zip(local, _grads(model), strict=True))


def test_denominators(make_samples) -> None:
    samples = make_samples(3, lengths=[(4, 3)])
    assert loss_denominator(samples, "samples") == 3
    assert loss_denominator(samples, "tokens") == 9
    expected = sum(float(s.weights[s.loss_mask != 0].sum()) for s in samples)
    assert loss_denominator(samples, "weight") == pytest.approx(expected)


def _on_policy_samples(model, rng: np.random.Generator, advantages: list[float]) -> list:
    """Samples whose rollout logprobs are the model's own (ratio 1 before the step)."""
    out = []
    for i, adv in enumerate(advantages):
        seq = random_sequence(rng, VOCAB, 6, 5, rollout_id=f"r{i}", advantage=adv)
        sample = decode_round_trip(sample_record([seq]))
        batch = collate([sample])
        with torch.no_grad():
            lp = batch.flat_tokens(token_logprobs(model, batch)).numpy()
        seq = SequenceSpec(seq.rollout_id, seq.prompt_ids, seq.output_ids, lp[6:], adv)
        out.append(decode_round_trip(sample_record([seq])))
    return out


def test_ratio_is_one_on_policy_and_the_loss_is_minus_the_weighted_advantage(tiny_model) -> None:
    samples = _on_policy_samples(tiny_model, np.random.default_rng(0), [1.0, -0.5])
    batch = collate(samples)
    logp = token_logprobs(tiny_model, batch)
    loss, stats = policy_loss(logp, batch, loss_denominator(samples), LossConfig())
    assert stats.mean_ratio == pytest.approx(1.0, abs=1e-5)
    assert stats.clip_fraction == 0
    assert abs(stats.approx_kl) < 1e-5
    assert float(loss.detach()) == pytest.approx(-(5 * 1.0 + 5 * -0.5) / 10, abs=1e-5)


def test_clipping_stops_the_gradient_beyond_the_trust_region(tiny_model) -> None:
    samples = _on_policy_samples(tiny_model, np.random.default_rng(1), [1.0])
    batch = collate(samples)
    logp = token_logprobs(tiny_model, batch)
    shifted = copy.copy(batch)
    # Pretend the rollout policy gave these tokens much lower probability: ratio e^1 > 1.2.
    shifted.rollout_logprobs = batch.rollout_logprobs - batch.loss_mask.float()
    tl = per_token_loss(logp, shifted, LossConfig(clip_high=0.2))
    assert tl.clipped[batch.loss_mask].all()
    (tl.loss.sum()).backward()
    assert all(p.grad is None or float(p.grad.abs().max()) == 0.0 for p in tiny_model.parameters())


def test_truncated_importance_sampling_caps_the_weight_but_keeps_the_gradient(tiny_model) -> None:
    samples = _on_policy_samples(tiny_model, np.random.default_rng(2), [1.0])
    batch = collate(samples)
    mask = batch.loss_mask
    shifted = copy.copy(batch)
    shifted.rollout_logprobs = batch.rollout_logprobs - mask.float()  # ratio e ≈ 2.72
    logp = token_logprobs(tiny_model, batch)
    tl = per_token_loss(logp, shifted, LossConfig(ratio_cap=2.0))
    assert tl.clipped[mask].all()
    grad = torch.autograd.grad(tl.loss.sum(), logp)[0]
    # d loss / d logp = -min(ratio, cap) * A = -2 on every sampled token.
    assert torch.allclose(grad[mask], torch.full_like(grad[mask], -2.0), atol=1e-5)
    assert (grad[~mask] == 0).all()


def test_dual_clip_bounds_negative_advantage_losses(tiny_model) -> None:
    samples = _on_policy_samples(tiny_model, np.random.default_rng(3), [-1.0])
    batch = collate(samples)
    shifted = copy.copy(batch)
    shifted.rollout_logprobs = batch.rollout_logprobs - 3 * batch.loss_mask.float()  # ratio e^3 ≈ 20
    logp = token_logprobs(tiny_model, batch)
    plain = per_token_loss(logp, shifted, LossConfig())
    dual = per_token_loss(logp, shifted, LossConfig(dual_clip=3.0))
    mask = batch.loss_mask
    assert (plain.loss[mask] > 19).all()
    assert torch.allclose(dual.loss[mask], torch.full_like(dual.loss[mask], 3.0))


def test_a_step_raises_positive_and_lowers_negative_advantage_tokens(tiny_model) -> None:
    samples = _on_policy_samples(tiny_model, np.random.default_rng(4), [1.0, 1.0, -1.0, -1.0])
    learner = Learner(tiny_model, LearnerConfig(learning_rate=1e-2, micro_batch_tokens=22))
    before = learner.sample_logprobs(samples)
    results = [learner.step(samples) for _ in range(5)]
    after = learner.sample_logprobs(samples)
    mask = collate(samples).flat_tokens(collate(samples).loss_mask)
    per_sample = 11
    for i, adv in enumerate([1.0, 1.0, -1.0, -1.0]):
        rows = slice(i * per_sample, (i + 1) * per_sample)
        delta = float((after[rows] - before[rows])[mask[rows]].sum())
        assert delta > 0 if adv > 0 else delta < 0
    assert results[-1].stats.loss < results[0].stats.loss
    assert results[0].micro_batches == 2 and results[0].grad_norm > 0
    # PPO: once every ratio has left the trust region, the clipped surrogate has no gradient left.
    assert results[-1].stats.clip_fraction == 1.0 and results[-1].grad_norm == 0.0


def test_zero_denominator_is_refused(make_samples, tiny_model) -> None:
    samples = make_samples(1)
    batch = collate(samples)
    with pytest.raises(ValueError, match="denominator"):
        policy_loss(token_logprobs(tiny_model, batch), batch, 0.0, LossConfig())


def test_bad_loss_config_is_refused() -> None:
    with pytest.raises(ValueError):
        LossConfig(ratio_cap=0)
    with pytest.raises(ValueError):
        LossConfig(dual_clip=0.5)
