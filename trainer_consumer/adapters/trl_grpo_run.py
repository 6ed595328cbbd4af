"""Train K steps through TRL's GRPOTrainer on prepared ``grpo_inputs`` (run in the TRL environment).

    .venv-trl/bin/python -c 'from trainer_consumer.adapters.trl_grpo_run import train_from_files as t
                             t("MODEL_DIR", "IN.pt", "OUT.pt")'

``IN.pt`` (torch.save): ``{"steps": [GrpoBatch.inputs, ...], "loss": {LossConfig fields},
"optimizer": {"lr", "betas", "weight_decay"}}``. Each step is TRL's ``training_step`` (its forward,
loss and backward) then one AdamW step with the given settings. ``OUT.pt``: ``{"losses": [...],
"grads": [{name: grad}, ...], "state_dict": ...}``. The test comparing TRL's losses with tokentrail's
runs this in a subprocess, because TRL's dependencies do not resolve in tokentrail's own environment.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from trainer_consumer.adapters.trl_grpo import grpo_config, grpo_trainer
from trainer_consumer.losses import LossConfig


def train(model: Any, steps: list[dict[str, torch.Tensor]], loss_cfg: LossConfig,
          optimizer_settings: dict[str, Any]) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    """Each step's loss and gradients (taken before the optimizer steps)."""
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = grpo_trainer(model, grpo_config(out_dir, loss_cfg))
        optimizer = torch.optim.AdamW(model.parameters(), lr=optimizer_settings["lr"],
                                      betas=tuple(optimizer_settings["betas"]),
                                      weight_decay=optimizer_settings["weight_decay"])
        losses, grads = [], []
        for inputs in steps:
            model.train()
            losses.append(float(trainer.training_step(model, inputs, None)))
            grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return losses, grads


def train_from_files(model_dir: str, batches: str, out: str) -> list[float]:
    """Load the model and the prepared steps, train, write the losses, gradients and final weights."""
    from transformers import AutoModelForCausalLM

    spec = torch.load(batches, weights_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    losses, grads = train(model, spec["steps"], LossConfig(**spec["loss"]), spec["optimizer"])
    torch.save({"losses": losses, "grads": grads, "state_dict": model.state_dict()}, out)
    return losses
