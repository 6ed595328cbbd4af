"""The TrainerStep event: which samples a step used, what it did, and what was filtered before it; and the
resume event (a TrainerStep with no samples) that records the trainer resuming from the last good version
after a release rollback."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas.ids import combine, event_id
from trainer_consumer.batching import Batch
from trainer_consumer.learner import StepResult
from trainer_consumer.rollback_resume import Resume


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


# A training step's resume fields (TrainerStep v3 defaults); ``trainer_resume_record`` fills them.
NOT_A_RESUME: dict[str, Any] = {"resumed_from_version": -1, "rolled_back_version": -1, "resume_release_id": "",
                                "resume_decision_id": "", "resume_reason": ""}


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
        **NOT_A_RESUME,
        "created_at_us": created_at_us if created_at_us is not None else time.time_ns() // 1000,
    }


def trainer_resume_id(run_id: str, decision_id: str, version_after: int) -> str:
    """Deterministic: the loop emits the event before it publishes the weights, so a crash in between
    re-does the resume on restart and emits the same id again (sinks deduplicate it)."""
    return event_id("trainer_resume", run_id, decision_id, version_after)


def trainer_resume_record(run_id: str, step: int, version_before: int, version_after: int, resume: Resume,
                          off_policy: OffPolicySettings = OffPolicySettings(),
                          created_at_us: int | None = None) -> dict[str, Any]:
    """The event of a resume after a rollback: nothing trained (no samples, no loss), the weights of
    ``resume.resume_from`` published again as ``version_after``. Kept on the TrainerStep topic and table, beside
    the steps it interrupts, so one ordered log per run says what every version it published was made from."""
    return {
        **trainer_step_record(run_id, step, version_before, version_after, Batch([], Counter(), []), None,
                              created_at_us=created_at_us, off_policy=off_policy),
        "event_id": trainer_resume_id(run_id, resume.decision_id, version_after),
        # ---- issue 22: the resume after a release rollback
        "resumed_from_version": resume.resume_from,
        "rolled_back_version": resume.rolled_back,
        "resume_release_id": resume.release_id,
        "resume_decision_id": resume.decision_id,
        "resume_reason": resume.reason,
    }
