"""Credit: how a rollout's reward reaches its sampled tokens, under a versioned credit configuration.

Levels (the reward itself is never modified; the Credit record references it):
  * ``rollout``: every sampled token gets the rollout's advantage (= its reward).
  * ``call``: call k of K successful calls gets ``reward * call_discount ** (K - 1 - k)``: the last
    turn gets the full reward, earlier turns a discounted one (``call_advantages``).
  * ``token``: sampled token t of T gets ``reward * token_discount ** (T - 1 - t)``, counted over the
    rollout's sampled tokens in call order; ``call_advantages`` then holds each call's mean.
Weights (the total loss weight of a rollout, ``rollout_weight``, and how it spreads over tokens):
  * ``token_mean`` (default): every sampled token gets ``rollout_weight / sampled_tokens`` — each
    rollout weighs the same whatever its length (avoids over-weighting long rollouts);
  * ``call_mean``: each call with sampled tokens gets ``rollout_weight / calls``, shared by its tokens;
  * ``token_sum``: every token gets ``rollout_weight`` (the total grows with the length, by choice).
Which calls train: successful, sampled (not scripted) calls, less those the ``parse_failures`` policy takes
out (processors/parse_failures.py: keep by default; mask the calls whose output did not parse; drop the
rollout). Sample building reads the per-token values from ``token_values``; splitting, merging or packing
only moves tokens, never changes these values, so a rollout's total weight is preserved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from processors.config import config_id
from processors.parse_failures import DEFAULT_POLICY, ParseFailurePolicy, trained_calls
from schemas.ids import event_id
from schemas.tokens import FLOAT_DTYPE, pack_floats, unpack_floats

Record = dict[str, Any]


class CreditConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    name: str = "default"
    level: Literal["rollout", "call", "token"] = "rollout"
    call_discount: float = Field(default=1.0, gt=0, le=1)
    token_discount: float = Field(default=1.0, gt=0, le=1)
    weighting: Literal["token_mean", "call_mean", "token_sum"] = "token_mean"
    rollout_weight: float = Field(default=1.0, gt=0)
    # What the output tokens of a call the family's parser could not parse do in training (keep, mask or
    # drop; processors/parse_failures.py says why keep is the default).
    parse_failures: ParseFailurePolicy = DEFAULT_POLICY

    # Added after version 1 with a default that keeps the old meaning: left out of the id while at their
    # default, so the ids already on stored credits and samples still name the same configuration.
    ID_OMITS_DEFAULTS: ClassVar[tuple[str, ...]] = ("parse_failures",)

    @property
    def id(self) -> str:
        return config_id(self)


def credit_event_id(reward_id: str, credit_config_id: str) -> str:
    return event_id("credit", reward_id, credit_config_id)


def _output_lengths(rollout: Record, cfg: CreditConfig) -> np.ndarray:
    """Per call: its output tokens in the loss (0 for a call that does not train)."""
    trained = trained_calls(rollout, cfg.parse_failures)
    return np.array([len(c["output_ids"]) // 4 if t else 0 for c, t in zip(rollout["calls"], trained, strict=True)],
                    dtype=np.int64)


def _token_advantages(reward: float, total: int, cfg: CreditConfig) -> np.ndarray:
    if cfg.token_discount == 1.0:
        return np.full(total, reward, dtype=np.float64)
    return reward * np.power(cfg.token_discount, np.arange(total - 1, -1, -1, dtype=np.float64))


def compute_credit(rollout: Record, reward: Record, cfg: CreditConfig) -> Record:
    """The Credit of one (unfiltered) reward."""
    lengths = _output_lengths(rollout, cfg)
    sampled = [i for i, t in enumerate(trained_calls(rollout, cfg.parse_failures)) if t]
    advantage = float(reward["reward"])
    call_adv = np.zeros(len(lengths), dtype=np.float64)
    if cfg.level == "rollout":
        call_adv[sampled] = advantage
    elif cfg.level == "call":
        k = len(sampled)
        steps = np.arange(k - 1, -1, -1, dtype=np.float64)
        call_adv[sampled] = advantage * np.power(cfg.call_discount, steps)
    else:
        token_adv = _token_advantages(advantage, int(lengths.sum()), cfg)
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        for i in sampled:
            if lengths[i]:
                call_adv[i] = float(token_adv[bounds[i]:bounds[i + 1]].mean())
    total = int(lengths.sum())
    weight = cfg.rollout_weight * total if cfg.weighting == "token_sum" else cfg.rollout_weight
    cfg_id = cfg.id
    return {"event_id": credit_event_id(reward["event_id"], cfg_id), "rollout_id": rollout["rollout_id"],
            "group_id": reward["group_id"], "reward_id": reward["event_id"], "credit_config_id": cfg_id,
            "level": cfg.level.upper(), "rollout_advantage": advantage,
            "call_ids": [c["call_id"] for c in rollout["calls"]], "call_advantages": pack_floats(call_adv),
            "rollout_weight": float(weight) if total else 0.0, "sampled_tokens": total,
            "created_at_us": int(reward["created_at_us"])}


def compute_credits(rollouts: list[Record], rewards: list[Record], cfg: CreditConfig) -> list[Record]:
    """Credits for the rewards that are not filtered (rollouts and rewards in the same order)."""
    return [compute_credit(r, w, cfg) for r, w in zip(rollouts, rewards, strict=True) if not w["filtered"]]


@dataclass(frozen=True)
class TokenValues:
    """Per trained token of a rollout (calls in order; ERROR, scripted and policy-masked calls contribute none)."""

    advantages: np.ndarray  # float32, one per sampled token
    weights: np.ndarray  # float32, one per sampled token
    offsets: np.ndarray  # int64, len(calls) + 1: call i owns [offsets[i], offsets[i+1])


def token_values(rollout: Record, credit: Record, cfg: CreditConfig) -> TokenValues:
    """The advantage and loss weight of every sampled token, from the Credit and its config."""
    if credit["credit_config_id"] != cfg.id:
        raise ValueError(f"credit {credit['event_id']} was made by config {credit['credit_config_id']}, "
                         f"not {cfg.id}")
    lengths = _output_lengths(rollout, cfg)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(offsets[-1])
    if cfg.level == "token":
        adv = _token_advantages(float(credit["rollout_advantage"]), total, cfg).astype(FLOAT_DTYPE)
    else:
        adv = np.repeat(unpack_floats(credit["call_advantages"]), lengths).astype(FLOAT_DTYPE, copy=False)
    rw = float(credit["rollout_weight"])
    if total == 0:
        weights = np.zeros(0, dtype=FLOAT_DTYPE)
    elif cfg.weighting in ("token_mean", "token_sum"):  # token_sum: rollout_weight grew with the length
        weights = np.full(total, rw / total, dtype=FLOAT_DTYPE)
    else:
        nonempty = int((lengths > 0).sum())
        per_call = np.where(lengths > 0, rw / nonempty / np.maximum(lengths, 1), 0.0)
        weights = np.repeat(per_call, lengths).astype(FLOAT_DTYPE)
    return TokenValues(adv, weights, offsets)
