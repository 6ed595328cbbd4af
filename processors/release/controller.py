"""The release controller's state and decisions, pure: fold observations, decide, apply a decision.

One ``ReleaseState`` per model (a release track): the serving version, the candidate and its ramp stage,
the pinned labels, and each version's totals since the release started. ``fold_reward``/``fold_call``
add observations; ``decide`` applies the rules (``processors.release.rules``) and says hold, ramp,
promote or roll back, with the counts, means, interval, rule and reason; ``apply`` moves the state on.
Operators' decisions (start, promote, rollback, pin) are made by the functions at the bottom and go
through the same ``apply``; a ReleaseDecision event (``processors.release.events``) records each.

Decisions of one model are numbered (``sequence``); a decision is applied only on the state whose next
number it carries, so when an operator and the controller decide at the same moment, the first one on
the topic wins and the other is kept as a record but changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from processors.errors import ProcessorError
from processors.release.arms import ArmStats, CallObservation, RewardObservation
from processors.release.plan import ReleasePlan
from processors.release.rules import Evaluation, Rule, evaluate
from processors.release.sequential import FloatArray
from schemas.ids import event_id

ACTIONS = ("start", "ramp", "promote", "rollback", "pin", "hold")
CONTROLLER = "controller"
OPERATOR = "operator"


class ReleaseError(ProcessorError):
    """A release decision that does not fit the current state (no candidate to promote, ...)."""


@dataclass(frozen=True)
class ReleaseState:
    model: str
    plan: ReleasePlan
    serving_version: int
    candidate_version: int | None = None
    stage: int = 0  # index into plan.ramp while there is a candidate
    release_id: str = ""  # the current release (empty when no candidate has been started yet)
    sequence: int = 0  # the number the next decision on this model gets
    pinned: Mapping[str, int] = field(default_factory=dict)
    serving: ArmStats = field(default_factory=ArmStats)
    candidate: ArmStats = field(default_factory=ArmStats)
    stage_start_rewards: int = 0  # candidate rewards when the current stage began

    @property
    def candidate_fraction(self) -> float:
        return self.plan.ramp[self.stage] if self.candidate_version is not None else 0.0

    def arm(self, version: int, pinned: bool) -> str | None:
        """Which side of the comparison an observation of ``version`` counts on (None: neither)."""
        if pinned or self.candidate_version is None:
            return None
        if version == self.candidate_version:
            return "candidate"
        return "serving" if version == self.serving_version else None


@dataclass(frozen=True)
class Decision:
    action: str  # one of ACTIONS
    rule: str
    reason: str
    source: str = CONTROLLER
    operator: str | None = None
    alpha: float | None = None  # level of the interval below
    interval_low: float | None = None  # always-valid interval of the deciding difference (candidate - serving)
    interval_high: float | None = None
    candidate_version: int | None = None  # start: the new candidate
    serving_version: int | None = None  # start: the serving version, when it changes
    pin_label: str | None = None  # pin: the label, and its version (None: unpinned)
    pin_version: int | None = None
    plan: ReleasePlan | None = None  # start: the plan of the new release (None: the model's current plan)


# ---- observations ---------------------------------------------------------------------------------


def fold_reward(state: ReleaseState, obs: RewardObservation) -> ReleaseState:
    side = state.arm(obs.version, obs.pinned)
    if side is None:
        return state
    return replace(state, **{side: getattr(state, side).with_reward(obs.value)})


def fold_call(state: ReleaseState, obs: CallObservation) -> ReleaseState:
    side = state.arm(obs.version, obs.pinned)
    if side is None:
        return state
    return replace(state, **{side: getattr(state, side).with_call(obs.ok, obs.latency_ms)})


# ---- the controller's decision --------------------------------------------------------------------


def evaluation(state: ReleaseState) -> Evaluation:
    return evaluate(state.plan, state.serving.arrays(), state.candidate.arrays(), state.stage,
                    state.stage_start_rewards)


def decide(state: ReleaseState) -> Decision:
    """Hold, ramp, promote or roll back, by the first rule that fires (``processors.release.rules``)."""
    if state.candidate_version is None:
        return Decision("hold", "no_candidate", "no release in progress")
    ev = evaluation(state)
    rule = Rule(int(ev.rule))
    g, r = state.plan.guard_rails, state.plan.reward
    s, c = state.serving, state.candidate
    if rule is Rule.ERROR_RATE:
        iv, alpha = ev.errors, g.alpha_rollback / 2
        reason = (f"candidate error rate {_num(c.error_rate)} vs serving {_num(s.error_rate)}: the difference "
                  f"is above {g.max_error_rate_diff} with confidence (interval {_iv(iv.low, iv.high)})")
    elif rule is Rule.LATENCY_RATIO:
        iv, alpha = ev.reward_promote, g.alpha_promote
        reason = (f"candidate mean latency {_num(c.latency_ms_mean)} ms is {_num(float(ev.latency_ratio))}x "
                  f"serving's {_num(s.latency_ms_mean)} ms (max {g.max_latency_ratio}x)")
    elif rule is Rule.REWARD_WORSE:
        iv, alpha = ev.reward_rollback, g.alpha_rollback / 2
        reason = (f"candidate reward mean {_num(c.reward_mean)} vs serving {_num(s.reward_mean)}: the difference "
                  f"is below {-r.rollback_margin} with confidence (interval {_iv(iv.low, iv.high)})")
    elif rule is Rule.MIN_SAMPLES:
        iv, alpha = ev.reward_promote, g.alpha_promote
        reason = (f"{s.rewards} serving and {c.rewards} candidate rewards; "
                  f"{g.min_samples_per_arm} per version before deciding")
    elif rule in (Rule.STAGE_RAMP, Rule.STAGE_HOLD):
        iv, alpha = ev.reward_promote, g.alpha_promote
        in_stage = c.rewards - state.stage_start_rewards
        if rule is Rule.STAGE_RAMP:
            reason = (f"{in_stage} candidate rewards at {state.candidate_fraction:.0%} and no guard fired: "
                      f"ramp to {state.plan.ramp[state.stage + 1]:.0%}")
        else:
            reason = f"{in_stage} of {g.min_samples_per_stage} candidate rewards at {state.candidate_fraction:.0%}"
    else:
        iv, alpha = ev.reward_promote, g.alpha_promote
        verdict = "is above" if rule is Rule.REWARD_BETTER else "is not yet above"
        reason = (f"candidate reward mean {_num(c.reward_mean)} vs serving {_num(s.reward_mean)}: the difference "
                  f"{verdict} {-r.promotion_margin} with confidence (interval {_iv(iv.low, iv.high)})")
    return Decision(rule.action, rule.label, reason, alpha=alpha,
                    interval_low=_finite(float(iv.low)), interval_high=_finite(float(iv.high)))


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _num(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.4g}"


def _iv(low: FloatArray, high: FloatArray) -> str:
    return f"[{_num(float(low))}, {_num(float(high))}]"


# ---- applying decisions ---------------------------------------------------------------------------


def release_id(model: str, serving_version: int, candidate_version: int, plan: ReleasePlan, sequence: int) -> str:
    """The id of a release: its versions, plan and the decision that started it (so restarting the same
    pair later is a new release, with its own routing cohort)."""
    return event_id("release", model, serving_version, candidate_version, plan.plan_id, sequence)


def apply(state: ReleaseState, decision: Decision) -> ReleaseState:
    """The state after ``decision`` (a hold changes nothing; every other decision takes the next number)."""
    action = decision.action
    if action == "hold":
        return state
    nxt = state.sequence + 1
    if action == "pin":
        if decision.pin_label is None:
            raise ReleaseError("a pin decision needs a label")
        pins = dict(state.pinned)
        if decision.pin_version is None:
            pins.pop(decision.pin_label, None)
        else:
            pins[decision.pin_label] = decision.pin_version
        return replace(state, pinned=pins, sequence=nxt)
    if action == "start":
        if decision.candidate_version is None:
            raise ReleaseError("a start decision needs a candidate version")
        serving = state.serving_version if decision.serving_version is None else decision.serving_version
        plan = decision.plan or state.plan
        rid = release_id(state.model, serving, decision.candidate_version, plan, state.sequence)
        return replace(state, plan=plan, serving_version=serving, candidate_version=decision.candidate_version,
                       stage=0, release_id=rid, sequence=nxt, pinned={**plan.pinned, **state.pinned},
                       serving=ArmStats(), candidate=ArmStats(), stage_start_rewards=0)
    if state.candidate_version is None:
        raise ReleaseError(f"cannot {action}: model {state.model!r} has no candidate (start a release first)")
    if action == "ramp":
        if state.stage + 1 >= len(state.plan.ramp):
            raise ReleaseError(f"cannot ramp: already at the last stage ({state.candidate_fraction:.0%}); promote")
        return replace(state, stage=state.stage + 1, sequence=nxt, stage_start_rewards=state.candidate.rewards)
    if action == "promote":
        return replace(state, serving_version=state.candidate_version, candidate_version=None, stage=0,
                       sequence=nxt, serving=ArmStats(), candidate=ArmStats(), stage_start_rewards=0)
    if action == "rollback":
        return replace(state, candidate_version=None, stage=0, sequence=nxt, serving=ArmStats(),
                       candidate=ArmStats(), stage_start_rewards=0)
    raise ReleaseError(f"unknown release action {action!r}; known: {', '.join(ACTIONS)}")


# ---- operators' decisions -------------------------------------------------------------------------


def initial_state(model: str, plan: ReleasePlan, serving_version: int) -> ReleaseState:
    """A model with no decision yet."""
    if not model:
        raise ReleaseError("a release needs a model name")
    if serving_version < 0:
        raise ReleaseError(f"serving version must be >= 0, got {serving_version}")
    return ReleaseState(model=model, plan=plan, serving_version=serving_version)


def start_decision(state: ReleaseState, candidate_version: int, operator: str, reason: str = "",
                   plan: ReleasePlan | None = None) -> Decision:
    if state.candidate_version is not None:
        raise ReleaseError(f"model {state.model!r} already has candidate {state.candidate_version} at "
                           f"{state.candidate_fraction:.0%}: promote or roll it back first")
    if candidate_version < 0:
        raise ReleaseError(f"candidate version must be >= 0, got {candidate_version}")
    if candidate_version == state.serving_version:
        raise ReleaseError(f"candidate {candidate_version} is already the serving version")
    ramp = (plan or state.plan).ramp
    return Decision("start", "manual", reason or f"operator started candidate {candidate_version} at {ramp[0]:.0%}",
                    source=OPERATOR, operator=operator, candidate_version=candidate_version,
                    serving_version=state.serving_version, plan=plan)


def manual_decision(state: ReleaseState, action: str, operator: str, reason: str = "") -> Decision:
    """An operator's promote, rollback or ramp of the current candidate."""
    if action not in ("promote", "rollback", "ramp"):
        raise ReleaseError(f"an operator decides promote, rollback or ramp here, not {action!r}")
    if state.candidate_version is None:
        raise ReleaseError(f"cannot {action}: model {state.model!r} has no candidate (start a release first)")
    if action == "ramp" and state.stage + 1 >= len(state.plan.ramp):
        raise ReleaseError(f"cannot ramp: already at the last stage ({state.candidate_fraction:.0%}); promote")
    return Decision(action, "manual", reason or f"operator decided to {action} candidate {state.candidate_version}",
                    source=OPERATOR, operator=operator)


def pin_decision(state: ReleaseState, label: str, version: int | None, operator: str, reason: str = "") -> Decision:
    if not label:
        raise ReleaseError("a pin needs a traffic label")
    if version is not None and version < 0:
        raise ReleaseError(f"pinned version must be >= 0, got {version}")
    if version is None and label not in state.pinned:
        raise ReleaseError(f"label {label!r} is not pinned on model {state.model!r}")
    text = f"unpin {label!r}" if version is None else f"pin {label!r} to version {version}"
    return Decision("pin", "manual", reason or f"operator: {text}", source=OPERATOR, operator=operator,
                    pin_label=label, pin_version=version)
