"""tokentrail samples -> Hugging Face TRL's ``GRPOTrainer`` training step, without re-tokenizing.

TRL's GRPO loss reads a dict of tensors (``prompt_ids``/``completion_ids`` and their masks, per-token
``advantages``, ``old_per_token_logps``, ``num_items_in_batch``, an optional ``tool_mask``). This module
builds that dict from tokentrail's ``TrainSample`` arrays and a ``GRPOTrainer`` whose input preparation
(normally: generate completions, score them) hands the dict through unchanged, so TRL's own forward
pass, per-token clipped surrogate, normalisation and backward run on tokentrail's tokens.

The mapping, and why it gives tokentrail's loss exactly:
- one row per packed sequence (tokentrail's padded collation); the "prompt" is the row's first token and
  the "completion" the rest, right-padded. No left padding, so position ids are the same as tokentrail's
  and nothing depends on how a model treats left-padded prompts. Token 0 has no logprob in either
  (tokentrail requires it to be off the loss mask).
- ``tool_mask`` (TRL multiplies it into the loss mask) carries tokentrail's loss mask times the token
  weights ("weight" normalisation) or the bare loss mask ("tokens").
- ``old_per_token_logps`` are the engine's rollout logprobs: the importance ratio is taken against the
  behaviour policy as recorded, exactly as tokentrail's loss does.
- TRL's ``loss_type="dapo"`` divides the masked sum by ``num_items_in_batch``; tokentrail's step-wide
  denominator (``loss_denominator``) is passed there, so the loss is ``sum(w * token_loss) / denominator``,
  tokentrail's normalisation, also across micro-batches and ranks.
- TRL has no policy versions; they stay beside the tensors (``GrpoBatch.policy_versions``) for the
  caller's staleness checks and logs.

Not mapped (a ``ValueError`` says so): tokentrail's "samples" normalisation, ``dual_clip``, ``ratio_cap``
and the engine/trainer importance correction (tis/mis); TRL's KL term (``beta``) is off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainer_consumer.collate import collate
from trainer_consumer.losses import LossConfig, loss_denominator
from trainer_consumer.sample_view import TrainSample


@dataclass(frozen=True)
class GrpoBatch:
    inputs: dict[str, torch.Tensor]  # what TRL's GRPOTrainer._compute_loss reads
    row_sample_ids: list[str]  # per row (one row per packed sequence)
    policy_versions: list[tuple[int, int]]  # per row: (first, last) policy version of its sample


def check_loss_config(cfg: LossConfig) -> None:
    """The part of tokentrail's loss that TRL's dapo loss reproduces; anything else is refused."""
    unsupported = []
    if cfg.normalization not in ("weight", "tokens"):
        unsupported.append(f"normalization={cfg.normalization!r}")
    if cfg.dual_clip is not None:
        unsupported.append("dual_clip")
    if cfg.ratio_cap is not None:
        unsupported.append("ratio_cap")
    if cfg.importance_sampling != "none":
        unsupported.append(f"importance_sampling={cfg.importance_sampling!r}")
    if unsupported:
        raise ValueError(f"TRL's GRPO loss has no equivalent of {', '.join(unsupported)}; "
                         "use normalization 'weight' or 'tokens' with the plain clipped surrogate")


def grpo_inputs(samples: Sequence[TrainSample], cfg: LossConfig | None = None,
                denominator: float | None = None, pad_id: int = 0) -> GrpoBatch:
    """TRL's GRPO inputs for ``samples``. ``denominator``: the whole step's (all micro-batches and ranks),
    computed from these samples when not given."""
    cfg = cfg or LossConfig()
    check_loss_config(cfg)
    if denominator is None:
        denominator = loss_denominator(samples, cfg.normalization)
    if denominator <= 0:
        raise ValueError(f"loss denominator must be > 0, got {denominator}")
    batch = collate(samples, layout="padded", pad_id=pad_id)
    assert batch.attention_mask is not None
    if bool(batch.loss_mask[:, 0].any()):
        raise ValueError("a sequence's first token is on the loss mask; it has no logprob to train")
    mask = batch.loss_mask.to(torch.float32)
    scale = mask * batch.weights if cfg.normalization == "weight" else mask
    attention = batch.attention_mask.to(torch.long)
    versions = {s.sample_id: (s.policy_version_first, s.policy_version_last) for s in samples}
    return GrpoBatch(
        inputs={
            "prompt_ids": batch.input_ids[:, :1],
            "prompt_mask": attention[:, :1],
            "completion_ids": batch.input_ids[:, 1:],
            "completion_mask": attention[:, 1:],
            "tool_mask": scale[:, 1:],
            "advantages": batch.advantages[:, 1:],
            "old_per_token_logps": batch.rollout_logprobs[:, 1:],
            "num_items_in_batch": torch.tensor(float(denominator)),
        },
        row_sample_ids=list(batch.row_sample_ids),
        policy_versions=[versions[s] for s in batch.row_sample_ids],
    )


def grpo_config(output_dir: str, cfg: LossConfig | None = None, **overrides: Any) -> Any:
    """A ``trl.GRPOConfig`` whose loss is tokentrail's (``cfg``): dapo normalisation, the same clip range,
    no KL, temperature 1, one micro-batch per step, on the CPU unless a GPU is there."""
    from trl import GRPOConfig

    cfg = cfg or LossConfig()
    check_loss_config(cfg)
    settings: dict[str, Any] = dict(
        output_dir=output_dir, loss_type="dapo", epsilon=cfg.clip_low, epsilon_high=cfg.clip_high,
        beta=0.0, temperature=1.0, importance_sampling_level="token", top_entropy_quantile=1.0,
        num_iterations=1, gradient_accumulation_steps=1, steps_per_generation=1,
        per_device_train_batch_size=2, num_generations=2, use_vllm=False, report_to=[],
        use_cpu=not torch.cuda.is_available(), logging_strategy="no", save_strategy="no",
        # TRL defaults to bf16 autocast; tokentrail computes its loss in the model's own dtype.
        bf16=False, fp16=False,
    )
    settings.update(overrides)
    return GRPOConfig(**settings)


def grpo_trainer(model: Any, args: Any) -> Any:
    """A ``trl.GRPOTrainer`` that trains on given ``grpo_inputs`` instead of generating: its input
    preparation only moves the tensors to the model's device. Call ``trainer.training_step(model,
    batch.inputs, None)`` (forward, TRL's loss, backward), then step your optimizer."""
    from datasets import Dataset
    from trl import GRPOTrainer

    class TokentrailGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
            device = self.accelerator.device
            return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}

    def no_reward(completions: list[Any], **_: Any) -> list[float]:
        raise RuntimeError("tokentrail samples carry their advantages; nothing is generated or scored here")

    # GRPOTrainer wants a prompt dataset and a reward function; neither is used (nothing is generated).
    placeholder = Dataset.from_dict({"prompt": ["unused", "unused"]})
    trainer = TokentrailGRPOTrainer(model=model, reward_funcs=no_reward, args=args, train_dataset=placeholder)
    # Set by transformers' own training loop, which this path replaces; the loss divides by it.
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer
