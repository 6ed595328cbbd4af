"""tokentrail samples through Hugging Face TRL's GRPOTrainer give tokentrail's loss and weights.

TRL runs in its own environment (``make setup-trl`` -> ``.venv-trl``; its dependencies conflict with
the main venv's), so the TRL side is a subprocess over a batch file; tokentrail's side is the Learner
here, on the same samples, from the same initial weights, with the same AdamW settings.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trainer_consumer.adapters.trl_grpo import grpo_inputs
from trainer_consumer.collate import collate
from trainer_consumer.learner import Learner, LearnerConfig
from trainer_consumer.losses import LossConfig, token_logprobs
from trainer_consumer.sample_view import TrainSample

from .helpers import make_tiny_model

REPO = Path(__file__).resolve().parents[2]
TRL_PYTHON = REPO / ".venv-trl" / "bin" / "python"
STEPS = 3
LR = 2e-2


def _near_policy(samples: list[TrainSample], model: torch.nn.Module, seed: int) -> list[TrainSample]:
    """Rollout logprobs near the model's own (noise 0.15 nats): ratios around 1, some clipped, so both
    the clipped and the unclipped branch of the surrogate carry gradient."""
    rng = np.random.default_rng(seed)
    out = []
    with torch.no_grad():
        for s in samples:
            batch = collate([s])
            logp = batch.flat_tokens(token_logprobs(model, batch)).numpy()
            noisy = (logp + rng.normal(0.0, 0.15, logp.shape)).astype(np.float32)
            out.append(dataclasses.replace(
                s, rollout_logprobs=np.where(s.loss_mask != 0, noisy, np.float32(np.nan))))
    return out


NORMALIZATIONS = ("weight", "tokens")


@pytest.mark.e2e
def test_trl_grpo_step_matches_tokentrail_loss(make_samples, tmp_path) -> None:
    if not TRL_PYTHON.exists():
        pytest.fail(f"{TRL_PYTHON} is missing: run `make setup-trl` (TRL lives apart from the main venv)")
    initial = make_tiny_model(seed=3)
    initial.save_pretrained(tmp_path / "model")
    steps = [_near_policy(make_samples(4, pack=2, seed=20 + k), initial, seed=k) for k in range(STEPS)]
    optimizer = {"lr": LR, "betas": (0.9, 0.999), "weight_decay": 0.0}
    calls = ["from trainer_consumer.adapters.trl_grpo_run import train_from_files"]
    for norm in NORMALIZATIONS:  # one TRL process for both (its import is most of the cost)
        cfg = LossConfig(normalization=norm)
        torch.save({"steps": [grpo_inputs(samples, cfg).inputs for samples in steps],
                    "loss": {"normalization": norm}, "optimizer": optimizer}, tmp_path / f"{norm}.pt")
        calls.append(f"train_from_files({str(tmp_path / 'model')!r}, {str(tmp_path / f'{norm}.pt')!r}, "
                     f"{str(tmp_path / f'{norm}-out.pt')!r})")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([str(TRL_PYTHON), "-c", "; ".join(calls)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for norm in NORMALIZATIONS:
        _same_training(LossConfig(normalization=norm), steps,
                       torch.load(tmp_path / f"{norm}-out.pt", weights_only=True))


def _same_training(cfg: LossConfig, steps: list[list[TrainSample]], trl: dict[str, Any]) -> None:
    """tokentrail's Learner on the same steps gives TRL's losses, per-step gradients and final weights."""
    ours = make_tiny_model(seed=3)
    learner = Learner(ours, LearnerConfig(layout="padded", micro_batch_tokens=None, learning_rate=LR,
                                          max_grad_norm=None, loss=cfg))
    our_losses, our_grads = [], []
    for samples in steps:  # Learner.step without clipping, keeping each step's gradients
        stats, _ = learner.accumulate_gradients(samples)
        our_losses.append(stats.loss)
        our_grads.append({n: p.grad.detach().clone() for n, p in ours.named_parameters()})
        learner.optimizer.step()
    for k, (a, b) in enumerate(zip(our_losses, trl["losses"], strict=True)):
        print(f"{cfg.normalization} step {k}: tokentrail {a:.8f}  TRL GRPO (dapo) {b:.8f}", file=sys.stderr)
    assert len(trl["losses"]) == STEPS
    assert trl["losses"] == pytest.approx(our_losses, rel=1e-4, abs=1e-6)
    assert len({round(x, 6) for x in our_losses}) == STEPS  # three different batches, three losses
    for k, (mine, theirs) in enumerate(zip(our_grads, trl["grads"], strict=True)):
        assert mine.keys() == theirs.keys()
        scale = max(float(g.abs().max()) for g in mine.values())
        assert scale > 1e-3  # the batches carry gradient
        for name, g in mine.items():
            assert torch.allclose(theirs[name], g, rtol=1e-3, atol=1e-5 * scale), f"step {k} {name}"
    # Adam divides by sqrt(v): an entry whose gradient is float noise (a key bias's true gradient is 0,
    # softmax cancels it) still moves ~lr, in either direction; so the weights agree to a fraction of lr.
    start = make_tiny_model(seed=3).state_dict()
    for name, ref in ours.state_dict().items():
        assert not torch.equal(ref, start[name]), f"{name} did not train"
        assert torch.allclose(trl["state_dict"][name], ref, atol=0.5 * LR * STEPS), name


def test_grpo_inputs_refuses_what_trl_cannot_express(make_samples) -> None:
    samples = make_samples(2, seed=1)
    with pytest.raises(ValueError, match="samples"):
        grpo_inputs(samples, LossConfig(normalization="samples"))
    with pytest.raises(ValueError, match="importance_sampling"):
        grpo_inputs(samples, LossConfig(importance_sampling="tis"))
    first_token_trained = dataclasses.replace(samples[0], loss_mask=np.ones_like(samples[0].loss_mask))
    with pytest.raises(ValueError, match="first token"):
        grpo_inputs([first_token_trained], LossConfig())
    batch = grpo_inputs(samples, LossConfig())  # the good input after the bad still converts
    rows = sum(s.num_sequences for s in samples)
    assert batch.inputs["completion_ids"].shape[0] == rows and len(batch.policy_versions) == rows
