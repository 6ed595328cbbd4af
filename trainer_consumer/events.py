"""The TrainerStep event: which samples a step used, what it did, and what was filtered before it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas.ids import combine, event_id
from trainer_consumer.batching import Batch
from trainer_consumer.learner import StepResult


def trainer_step_id(run_id: str, step: int, sample_ids: Sequence[str], positions: Sequence[object]) -> str:
    """Deterministic: a re-run of the same step on the same records (after a crash before the
    offset commit) yields the same id, so sinks deduplicate it."""
    return event_id("trainer_step", run_id, step, list(sample_ids), combine(str(p) for p in positions))


@dataclass(frozen=True)
class OffPolicySettings:
    """What the step ran under, recorded on its event (the figures come from the step's result)."""

    importance_sampling: str = "none"
    max_staleness: int = -1  # -1: not recorded (events before issue 19)
    stale_rule: str = "drop"


def trainer_step_record(run_id: str, step: int, version_before: int, version_after: int,
                        batch: Batch[Any], result: StepResult | None,
                        created_at_us: int | None = None,
                        off_policy: OffPolicySettings = OffPolicySettings()) -> dict[str, Any]:
    """The event for one optimizer step, or (``result`` None) for a batch that was entirely filtered:
    then ``step`` is the last completed step, nothing was trained and the record exists so the
    filtered samples are accounted for when their offsets are committed."""
    sample_ids = batch.sample_ids if result is not None else []
    stats = result.stats if result is not None else None
    mismatch = result.mismatch if result is not None else None
    return {
        "event_id": trainer_step_id(run_id, step, sample_ids, batch.positions),
        "run_id": run_id,
        "step": step,
        "policy_version_before": version_before,
        "policy_version_after": version_after,
        "sample_ids": sample_ids,
        "tokens": result.tokens if result is not None else 0,
        "loss": stats.loss if stats is not None else 0.0,
        "mean_ratio": stats.mean_ratio if stats is not None else 1.0,
        "clip_fraction": stats.clip_fraction if stats is not None else 0.0,
        "mean_advantage": stats.mean_advantage if stats is not None else 0.0,
        "filtered_json": batch.filtered_json(),
        # ---- issue 19: off-policy truth (engine/trainer mismatch, importance sampling) and staleness
        "mismatch_tokens": mismatch.tokens if mismatch is not None else 0,
        "mismatch_mean_abs": mismatch.mean_abs if mismatch is not None else 0.0,
        "mismatch_max_abs": mismatch.max_abs if mismatch is not None else 0.0,
        "mismatch_beyond_fraction": mismatch.beyond_fraction if mismatch is not None else 0.0,
        "mismatch_bound": mismatch.bound if mismatch is not None else 0.0,
        "importance_sampling": off_policy.importance_sampling,
        "importance_tokens": stats.importance_tokens if stats is not None else 0,
        "importance_truncated": stats.importance_truncated if stats is not None else 0,
        "max_staleness": off_policy.max_staleness,
        "stale_rule": off_policy.stale_rule,
        "stale_dropped_ids": list(batch.stale_dropped_ids),
        "stale_masked_tokens": batch.stale_masked_tokens,
        # ---- end issue 19
        "created_at_us": created_at_us if created_at_us is not None else time.time_ns() // 1000,
    }
