"""ReleaseDecision events (schemas/release_decision.avsc): built from a decision, and folded back into state.

The topic ``tokentrail.release-decisions`` is the release's source of truth: folding it in order gives
every model's current serving version, candidate, ramp stage and pins (what the gateway routes by and
what ``tokentrail release status`` shows). A decision whose ``sequence`` is not the model's next number
lost a race to another decision: it stays on the topic (and in ClickHouse) and changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from processors.errors import InvalidEvent
from processors.release.arms import ArmStats
from processors.release.controller import Decision, ReleaseState, apply
from processors.release.plan import load_plan
from schemas.ids import event_id

RELEASE_DECISION = "ReleaseDecision"
RECORDED_ACTIONS = ("start", "ramp", "promote", "rollback", "pin")  # a hold is never recorded
Record = dict[str, Any]


def decision_event_id(model: str, sequence: int, action: str, release_id: str, source: str) -> str:
    return event_id("release-decision", model, sequence, action, release_id, source)


def decision_record(before: ReleaseState, decision: Decision, created_at_us: int) -> tuple[Record, ReleaseState]:
    """The ReleaseDecision record of ``decision`` taken on ``before``, and the state after it.

    Counts, means and variances are those the decision was taken on; versions are the pair it is about;
    fraction, stage and pins are the traffic after it."""
    after = apply(before, decision)
    if decision.action == "hold":
        raise InvalidEvent("a hold changes nothing and is not recorded")
    about_serving, about_candidate = before.serving_version, before.candidate_version
    if decision.action == "start":
        about_serving, about_candidate = after.serving_version, after.candidate_version
    fraction = {"promote": 1.0, "rollback": 0.0}.get(decision.action, after.candidate_fraction)
    record: Record = {
        "event_id": decision_event_id(before.model, before.sequence, decision.action, after.release_id,
                                      decision.source),
        "model": before.model,
        "sequence": before.sequence,
        "release_id": after.release_id,
        "action": decision.action,
        "source": decision.source,
        "operator": decision.operator,
        "serving_version": about_serving,
        "candidate_version": about_candidate,
        "candidate_fraction": fraction,
        "stage": after.stage,
        "pinned_json": json.dumps(dict(sorted(after.pinned.items())), separators=(",", ":")),
        "plan_id": after.plan.plan_id,
        "plan_json": json.dumps(after.plan.model_dump(mode="json"), sort_keys=True, separators=(",", ":")),
        "rule": decision.rule,
        "reason": decision.reason,
        "alpha": decision.alpha,
        "interval_low": decision.interval_low,
        "interval_high": decision.interval_high,
        **_arm_fields("serving", before.serving),
        **_arm_fields("candidate", before.candidate),
        "created_at_us": created_at_us,
    }
    return record, after


def _arm_fields(prefix: str, arm: ArmStats) -> Record:
    return {
        f"{prefix}_rewards": arm.rewards,
        f"{prefix}_reward_mean": arm.reward_mean,
        f"{prefix}_reward_var": arm.reward_variance,
        f"{prefix}_calls": arm.calls,
        f"{prefix}_errors": arm.errors,
        f"{prefix}_latency_ms_mean": arm.latency_ms_mean,
    }


def _arm_from(prefix: str, record: Record) -> ArmStats:
    return ArmStats.from_summary(record[f"{prefix}_rewards"], record[f"{prefix}_reward_mean"],
                                 record[f"{prefix}_reward_var"], record[f"{prefix}_calls"],
                                 record[f"{prefix}_errors"], record[f"{prefix}_latency_ms_mean"])


def state_after(record: Record) -> ReleaseState:
    """The model's state right after the decision ``record`` (totals as the decision recorded them)."""
    try:
        plan = load_plan(json.loads(record["plan_json"]))
        pinned = {str(k): int(v) for k, v in json.loads(record["pinned_json"]).items()}
        action = record["action"]
        serving, candidate = record["serving_version"], record["candidate_version"]
        state = ReleaseState(model=record["model"], plan=plan, serving_version=serving,
                             candidate_version=candidate, stage=record["stage"], release_id=record["release_id"],
                             sequence=record["sequence"] + 1, pinned=pinned)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidEvent(f"ReleaseDecision {record.get('event_id')!r} is malformed: {exc}") from exc
    if action not in RECORDED_ACTIONS:
        raise InvalidEvent(f"ReleaseDecision {record.get('event_id')!r} has unknown action {action!r}; "
                           f"known: {', '.join(RECORDED_ACTIONS)}")
    if action == "promote":
        return replace(state, serving_version=candidate, candidate_version=None, stage=0)
    if action == "rollback":
        return replace(state, candidate_version=None, stage=0)
    if action in ("ramp", "pin") and candidate is not None:
        cand = _arm_from("candidate", record)
        kept = replace(state, serving=_arm_from("serving", record), candidate=cand)
        # A pin keeps the stage's start; a ramp starts a stage at the candidate's count.
        return replace(kept, stage_start_rewards=cand.rewards) if action == "ramp" else kept
    return state


@dataclass
class DecisionLog:
    """Every model's state, folded from the decisions in topic order. ``stale`` lists decisions that lost
    a race (their sequence was not the model's next number), ``rejected`` malformed ones with the reason;
    neither changes any state, and folding goes on past them."""

    states: dict[str, ReleaseState]
    applied: list[Record]
    stale: list[Record]
    rejected: list[tuple[Record, str]]

    @classmethod
    def fold(cls, records: Iterable[Record]) -> DecisionLog:
        log = cls({}, [], [], [])
        for record in records:
            log.add(record)
        return log

    def add(self, record: Record) -> bool:
        """Fold one decision; False when it is stale or malformed."""
        model = record.get("model")
        current = self.states.get(model) if isinstance(model, str) else None
        expected = current.sequence if current is not None else 0
        if record.get("sequence") != expected:
            self.stale.append(record)
            return False
        try:
            self.states[record["model"]] = state_after(record)
        except InvalidEvent as exc:
            self.rejected.append((record, str(exc)))
            return False
        self.applied.append(record)
        return True
