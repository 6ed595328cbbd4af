"""The reference policy-gradient loss: a PPO/GRPO clipped surrogate on sampled tokens.

The importance ratio is ``exp(logp_new - rollout_logprob)``: the rollout log probability recorded
by the engine at sampling time is the behaviour policy, never recomputed. With ``ratio_cap`` set the
objective is truncated importance sampling instead: the gradient of each token is
``min(ratio, cap) * advantage * grad(logp_new)``.

Engine/trainer mismatch correction (``importance_sampling``): the engine's recorded logprobs and the
trainer's recomputation under the same (behaviour) weights differ (precision, kernels). With ``tis``
or ``mis`` and the trainer's behaviour logprobs known for a token, the PPO ratio is taken against
the trainer's behaviour logprob and the token's loss is multiplied by the engine-to-trainer
importance weight ``w = exp(behaviour - rollout)``: ``tis`` truncates it at ``importance_cap``,
``mis`` masks the token (weight 0) when ``w`` lies outside ``[1/cap, cap]``. Tokens whose behaviour
logprob is unknown keep the plain ratio against the rollout logprob with weight 1.

Normalization: the step's loss is ``sum(weight * token_loss) / denominator`` where the denominator
is computed once over *all* samples of the optimizer step (``loss_denominator``). Each micro-batch
contributes its partial sum over the same denominator, so accumulating gradients over any split of
the step gives the gradient of the whole batch; a per-micro-batch mean would not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from trainer_consumer.collate import TokenBatch
from trainer_consumer.sample_view import TrainSample

Normalization = Literal["weight", "tokens", "samples"]
ImportanceSampling = Literal["none", "tis", "mis"]
IMPORTANCE_SAMPLING: tuple[str, ...] = ("none", "tis", "mis")

# exp() of a log-ratio beyond this is a numerical accident, not information; clamp before exp.
MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2  # ratio floor 1 - clip_low
    clip_high: float = 0.2  # ratio ceiling 1 + clip_high (raise it for "clip-higher")
    dual_clip: float | None = None  # for negative advantages, bound the loss by dual_clip * |A|
    ratio_cap: float | None = None  # truncated importance sampling instead of the clipped surrogate
    # "weight": sum of per-token weights (the sample builder's weights decide what a unit is);
    # "tokens": number of loss tokens; "samples": number of samples.
    normalization: Normalization = "weight"
    # Engine/trainer mismatch correction (module docstring); the cap bounds TIS, the threshold of MIS.
    importance_sampling: ImportanceSampling = "none"
    importance_cap: float = 2.0

    def __post_init__(self) -> None:
        if self.importance_sampling not in IMPORTANCE_SAMPLING:
            raise ValueError(f"importance_sampling must be one of {IMPORTANCE_SAMPLING}")
        if self.importance_cap < 1:
            raise ValueError("importance_cap must be >= 1")
        if self.clip_low < 0 or self.clip_high < 0:
            raise ValueError("clip_low and clip_high must be >= 0")
        if self.ratio_cap is not None and self.ratio_cap <= 0:
            raise ValueError("ratio_cap must be > 0")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError("dual_clip must be > 1")


def loss_denominator(samples: Sequence[TrainSample], normalization: Normalization = "weight") -> float:
    """The step-wide denominator, from every sample of the optimizer step (before any split)."""
    if normalization == "samples":
        return float(len(samples))
    total = 0.0
    for s in samples:
        mask = s.loss_mask != 0
        if normalization == "tokens":
            total += float(mask.sum())
        else:
            total += float(s.weights[mask].sum(dtype=np.float64))
    return total


def token_logprobs(model: Any, batch: TokenBatch) -> torch.Tensor:
    """``logp[r, t] = log p(input_ids[r, t] | input_ids[r, :t])`` under ``model``; 0 in column 0.

    Packed batches pass ``position_ids`` with no attention mask: transformers then detects the
    sequence boundaries from the restarting positions and keeps attention inside each sequence.
    """
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                position_ids=batch.position_ids, use_cache=False)
    logits = out.logits[:, :-1].float()
    targets = batch.input_ids[:, 1:]
    # cross_entropy is the fused log-softmax + gather: no second (rows, len, vocab) tensor.
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return F.pad(-nll.view(targets.shape), (1, 0))


@dataclass(frozen=True)
class ImportanceWeights:
    weight: torch.Tensor  # per token, detached; 1 where no correction applies
    known: torch.Tensor  # bool: loss tokens whose behaviour logprob is known (the correction applies)
    truncated: torch.Tensor  # bool: TIS truncated, or MIS masked, this token


def importance_weights(behaviour: torch.Tensor | None, rollout: torch.Tensor, mask: torch.Tensor,
                       mode: ImportanceSampling, cap: float) -> ImportanceWeights:
    """Engine-to-trainer weights ``exp(behaviour - rollout)``, truncated (tis) or masked (mis).

    ``behaviour`` holds the trainer's logprobs under the behaviour weights, NaN where unknown."""
    ones = torch.ones_like(rollout)
    none = torch.zeros_like(mask)
    if behaviour is None:
        return ImportanceWeights(ones, none, none)
    known = mask & torch.isfinite(behaviour)
    if mode == "none":
        return ImportanceWeights(ones, known, none)
    log_w = torch.where(known, behaviour.detach() - rollout, torch.zeros_like(rollout))
    w = torch.exp(log_w.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    if mode == "tis":
        truncated = known & (w > cap)
        return ImportanceWeights(w.clamp(max=cap), known, truncated)
    truncated = known & ((w > cap) | (w < 1.0 / cap))
    return ImportanceWeights(torch.where(truncated, torch.zeros_like(w), w), known, truncated)


@dataclass(frozen=True)
class TokenLoss:
    loss: torch.Tensor  # per token, 0 off the loss mask
    ratio: torch.Tensor  # detached
    clipped: torch.Tensor  # bool: the clip (or the cap) bound this token
    importance: ImportanceWeights


def per_token_loss(logp_new: torch.Tensor, batch: TokenBatch, cfg: LossConfig,
                   behaviour: torch.Tensor | None = None) -> TokenLoss:
    """``behaviour``: the trainer's logprobs under each token's behaviour weights (NaN unknown), used
    by ``importance_sampling`` tis/mis; ignored (measured only) with none."""
    mask = batch.loss_mask
    iw = importance_weights(behaviour, batch.rollout_logprobs, mask, cfg.importance_sampling,
                            cfg.importance_cap)
    old = batch.rollout_logprobs
    if cfg.importance_sampling != "none" and behaviour is not None:
        old = torch.where(iw.known, behaviour.detach(), batch.rollout_logprobs)
    log_ratio = torch.where(mask, logp_new - old, torch.zeros_like(logp_new))
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    adv = batch.advantages
    if cfg.ratio_cap is not None:
        is_weight = ratio.detach().clamp(max=cfg.ratio_cap)
        # exp(x - sg(x)) is 1 with gradient grad(x): the surrogate's gradient is is_weight*A*grad(logp).
        surrogate = is_weight * torch.exp(logp_new - logp_new.detach()) * adv
        clipped = ratio.detach() > cfg.ratio_cap
    else:
        unclipped = ratio * adv
        bounded = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv
        surrogate = torch.minimum(unclipped, bounded)
        clipped = (bounded < unclipped).detach()
        if cfg.dual_clip is not None:
            floor = cfg.dual_clip * adv
            dual = (adv < 0) & (surrogate < floor)
            surrogate = torch.where(dual, floor, surrogate)
            clipped = clipped | dual.detach()
    if cfg.importance_sampling != "none":
        surrogate = iw.weight * surrogate
    zero = torch.zeros_like(surrogate)
    return TokenLoss(loss=torch.where(mask, -surrogate, zero), ratio=ratio.detach(), clipped=clipped & mask,
                     importance=iw)


@dataclass
class LossStats:
    """Sums over the loss tokens of a step (accumulated across micro-batches)."""

    loss: float = 0.0
    tokens: int = 0
    ratio_sum: float = 0.0
    clipped: int = 0
    advantage_sum: float = 0.0
    logprob_diff_sum: float = 0.0  # sum of (rollout_logprob - logp_new): a k1 estimate of KL
    importance_tokens: int = 0  # loss tokens with a known behaviour logprob
    importance_truncated: int = 0  # of those, truncated (tis) or masked (mis)

    def add(self, other: LossStats) -> None:
        self.importance_tokens += other.importance_tokens
        self.importance_truncated += other.importance_truncated
        self.loss += other.loss
        self.tokens += other.tokens
        self.ratio_sum += other.ratio_sum
        self.clipped += other.clipped
        self.advantage_sum += other.advantage_sum
        self.logprob_diff_sum += other.logprob_diff_sum

    def _mean(self, total: float) -> float:
        return total / self.tokens if self.tokens else 0.0

    @property
    def mean_ratio(self) -> float:
        return self._mean(self.ratio_sum) if self.tokens else 1.0

    @property
    def clip_fraction(self) -> float:
        return self._mean(float(self.clipped))

    @property
    def mean_advantage(self) -> float:
        return self._mean(self.advantage_sum)

    @property
    def approx_kl(self) -> float:
        return self._mean(self.logprob_diff_sum)

    @property
    def importance_truncated_fraction(self) -> float:
        return self.importance_truncated / self.importance_tokens if self.importance_tokens else 0.0


def policy_loss(logp_new: torch.Tensor, batch: TokenBatch, denominator: float,
                cfg: LossConfig, behaviour: torch.Tensor | None = None) -> tuple[torch.Tensor, LossStats]:
    """This micro-batch's share of the step loss (backward it and accumulate), and its stats."""
    if denominator <= 0:
        raise ValueError(f"loss denominator must be > 0, got {denominator}")
    tl = per_token_loss(logp_new, batch, cfg, behaviour)
    if cfg.normalization == "weight":
        scale = batch.weights
    elif cfg.normalization == "tokens":
        scale = batch.loss_mask.to(tl.loss.dtype)
    else:  # "samples": each sample's loss is its weighted token mean, summed over samples
        scale = _per_sample_token_share(batch)
    loss = (tl.loss * scale).sum() / denominator
    mask = batch.loss_mask
    with torch.no_grad():
        stats = LossStats(
            loss=float(loss.detach()),
            tokens=int(mask.sum()),
            ratio_sum=float(tl.ratio[mask].sum()),
            clipped=int(tl.clipped.sum()),
            advantage_sum=float(batch.advantages[mask].sum()),
            logprob_diff_sum=float((batch.rollout_logprobs - logp_new.detach())[mask].sum()),
            importance_tokens=int(tl.importance.known.sum()),
            importance_truncated=int(tl.importance.truncated.sum()),
        )
    return loss, stats


def _per_sample_token_share(batch: TokenBatch) -> torch.Tensor:
    """weight / (sample's total weight): each sample then sums to 1 whatever its length."""
    flat_w = batch.flat_tokens(batch.weights)
    sample_of_row = {sid: i for i, sid in enumerate(batch.sample_ids)}
    lengths = (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).long()
    row_sample = torch.tensor([sample_of_row[s] for s in batch.row_sample_ids], dtype=torch.long)
    token_sample = torch.repeat_interleave(row_sample, lengths)
    totals = torch.zeros(len(sample_of_row), dtype=flat_w.dtype).index_add_(0, token_sample, flat_w)
    share_flat = flat_w / totals[token_sample].clamp_min(torch.finfo(flat_w.dtype).tiny)
    share = torch.zeros_like(batch.weights)
    if batch.layout == "packed":
        share[0] = share_flat
    else:
        assert batch.attention_mask is not None
        share[batch.attention_mask.bool()] = share_flat
    return share
