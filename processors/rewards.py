"""Rewards from raw scores under a versioned reward configuration. Raw scores are never changed.

Per rollout:  metrics (values read from raw verifier outputs)  ->  combined (weighted sum, min or
max) = ``raw_reward``  ->  minus the length penalty  ->  group normalization (grpo: (r - mean) /
(std + eps); rloo: r - mean of the others; none)  ->  clip  =  ``reward``.
Filters mark rewards ``filtered`` with a reason instead of dropping them: a score that failed
(ERROR / TIMEOUT) or lacks the metric (``on_error: filter``), LATE groups, PARTIAL groups when
configured, groups below ``min_group_size``, zero-variance groups. Filtered rewards get no credit
and no samples. Normalization statistics use the rollouts that are not filtered.

Every reward names the scores it used (``score_ids``) and the configuration (``reward_config_id``,
the content hash of the normalized configuration).
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from processors.call_tokens import sampled_token_count
from processors.config import config_id
from processors.errors import PipelineInputError
from processors.jsonutil import canonical_json, get_path
from schemas.ids import event_id

Record = dict[str, Any]


class MetricSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    verifier: str = Field(min_length=1)
    version: str | None = None  # pin a verifier version (exact tag, or the part before "+o")
    path: str = ""  # dotted path into the raw output; "" = the raw output itself
    weight: float = 1.0
    on_error: Literal["filter", "default"] = "filter"
    default: float = 0.0  # the value used when on_error is "default"


class FilterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    zero_variance: bool = True
    zero_variance_eps: float = Field(default=1e-9, ge=0)
    min_group_size: int = Field(default=1, ge=1)
    partial_groups: Literal["keep", "filter"] = "keep"


class NormalizeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["grpo", "rloo", "none"] = "grpo"
    scale_by_std: bool = True  # grpo only; False gives mean-centred rewards (Dr. GRPO style)
    std_ddof: Literal[0, 1] = 0
    eps: float = Field(default=1e-6, ge=0)


class LengthPenalty(BaseModel):
    """penalty = coef * clamp((sampled_tokens - free_tokens) / span_tokens, 0, 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    coef: float = Field(default=0.0, ge=0)
    free_tokens: int = Field(default=0, ge=0)
    span_tokens: int = Field(default=1024, gt=0)


class RewardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1  # configuration format version
    name: str = "default"
    metrics: list[MetricSpec] = Field(min_length=1)
    combine: Literal["weighted_sum", "min", "max"] = "weighted_sum"
    filters: FilterSpec = FilterSpec()
    normalize: NormalizeSpec = NormalizeSpec()
    clip: tuple[float, float] | None = None
    length_penalty: LengthPenalty = LengthPenalty()

    @model_validator(mode="after")
    def _check(self) -> RewardConfig:
        names = [m.name for m in self.metrics]
        if len(set(names)) != len(names):
            raise ValueError(f"metric names must be unique: {names}")
        if self.clip is not None and not self.clip[0] < self.clip[1]:
            raise ValueError(f"clip must be [low, high] with low < high, got {list(self.clip)}")
        return self

    @property
    def id(self) -> str:
        return config_id(self)


def reward_event_id(rollout_event_id: str, group_event_id: str, reward_config_id: str) -> str:
    return event_id("reward", rollout_event_id, group_event_id, reward_config_id)


def _version_matches(pinned: str | None, version: str) -> bool:
    return pinned is None or version == pinned or version.split("+o", 1)[0] == pinned


def _find_score(scores: list[Record], metric: MetricSpec, rollout_id: str) -> Record | None:
    found = [s for s in scores if s["verifier_name"] == metric.verifier
             and _version_matches(metric.version, s["verifier_version"])]
    if len(found) > 1:
        versions = sorted({s["verifier_version"] for s in found})
        raise PipelineInputError(f"rollout {rollout_id}: {len(found)} scores of verifier {metric.verifier} "
                                 f"(versions {versions}); pin the metric's version")
    return found[0] if found else None


def _metric_value(score: Record | None, metric: MetricSpec) -> tuple[float | None, str | None]:
    """(value, problem); value None means the metric is unavailable."""
    if score is None:
        return None, f"no score from verifier {metric.verifier}"
    if score["status"] != "OK":
        return None, f"verifier {metric.verifier} {score['status']}"
    raw = json.loads(score["raw_json"])
    value = get_path(raw, metric.path, None)
    if isinstance(value, bool):
        return float(value), None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value), None
    return None, f"verifier {metric.verifier} output has no number at {metric.path or '(root)'!r}"


def _mean_std(values: list[float], ddof: int) -> tuple[float, float]:
    n = len(values)
    mean = math.fsum(values) / n
    if n - ddof <= 0:
        return mean, 0.0
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - ddof))


def compute_rewards(group: Record, rollouts: list[Record], scores: list[Record],
                    cfg: RewardConfig) -> list[Record]:
    """One Reward per rollout of the group, in the group's order."""
    cfg_id = cfg.id
    by_rollout: dict[str, list[Record]] = {}
    for s in scores:
        by_rollout.setdefault(s["rollout_event_id"], []).append(s)

    rows = []
    for rollout in rollouts:
        mine = by_rollout.get(rollout["event_id"], [])
        metrics: dict[str, float] = {}
        used: list[str] = []
        defaults: list[str] = []
        reason = None
        for metric in cfg.metrics:
            score = _find_score(mine, metric, rollout["rollout_id"])
            if score is not None:
                used.append(score["event_id"])
            value, problem = _metric_value(score, metric)
            if value is None:
                if metric.on_error == "default":
                    value = metric.default
                    defaults.append(metric.name)
                elif reason is None:
                    reason = f"score_error: {problem}"
            metrics[metric.name] = value if value is not None else float("nan")
        if reason is None:
            values = [metrics[m.name] for m in cfg.metrics]
            weights = [m.weight for m in cfg.metrics]
            if cfg.combine == "weighted_sum":
                combined = math.fsum(w * v for w, v in zip(weights, values, strict=True))
            elif cfg.combine == "min":
                combined = min(w * v for w, v in zip(weights, values, strict=True))
            else:
                combined = max(w * v for w, v in zip(weights, values, strict=True))
        else:
            combined = 0.0
        lp = cfg.length_penalty
        tokens = sampled_token_count(rollout)
        penalty = lp.coef * min(1.0, max(0.0, (tokens - lp.free_tokens) / lp.span_tokens))
        rows.append({"rollout": rollout, "metrics": metrics, "used": sorted(set(used)), "defaults": defaults,
                     "reason": reason, "combined": combined, "penalty": penalty, "pre": combined - penalty,
                     "tokens": tokens})

    group_reason = None
    if group["status"] == "LATE":
        group_reason = "late: rollout arrived after its group closed"
    elif group["status"] == "PARTIAL" and cfg.filters.partial_groups == "filter":
        group_reason = "partial_group"
    eligible = [r for r in rows if r["reason"] is None]
    if group_reason is None and len(eligible) < cfg.filters.min_group_size:
        group_reason = f"group_too_small: {len(eligible)} scored rollouts < {cfg.filters.min_group_size}"
    pres = [r["pre"] for r in eligible]
    if group_reason is None and eligible and cfg.filters.zero_variance and \
            max(pres) - min(pres) <= cfg.filters.zero_variance_eps:
        group_reason = "zero_variance: every rollout of the group has the same reward"
    if group_reason is not None:
        for r in eligible:
            r["reason"] = group_reason
        eligible = []

    norm = cfg.normalize
    stats: dict[str, Any] = {"method": norm.method, "n": len(eligible)}
    if eligible:
        mean, std = _mean_std(pres, norm.std_ddof)
        stats.update(mean=mean, std=std)
        total = math.fsum(pres)
        for r in eligible:
            if norm.method == "grpo":
                value = (r["pre"] - mean) / (std + norm.eps) if norm.scale_by_std else r["pre"] - mean
            elif norm.method == "rloo":
                n = len(eligible)
                value = r["pre"] - (total - r["pre"]) / (n - 1) if n > 1 else 0.0
            else:
                value = r["pre"]
            if cfg.clip is not None:
                value = min(max(value, cfg.clip[0]), cfg.clip[1])
            r["reward"] = value

    out = []
    for r in rows:
        rollout = r["rollout"]
        filtered = r["reason"] is not None
        components = {"metrics": {k: (None if math.isnan(v) else v) for k, v in r["metrics"].items()},
                      "defaults_used": r["defaults"], "length_penalty": r["penalty"],
                      "sampled_tokens": r["tokens"], "pre_normalization": r["pre"], "group": stats}
        out.append({
            "event_id": reward_event_id(rollout["event_id"], group["event_id"], cfg_id),
            "rollout_id": rollout["rollout_id"], "group_id": group["group_id"], "reward_config_id": cfg_id,
            "score_ids": r["used"], "raw_reward": float(r["combined"]),
            "reward": 0.0 if filtered else float(r["reward"]), "components_json": canonical_json(components),
            "filtered": filtered, "filter_reason": r["reason"], "created_at_us": int(group["created_at_us"]),
        })
    return out
