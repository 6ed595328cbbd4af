"""The controller's decision rules, vectorised: one call evaluates one release or thousands of simulated ones.

Rules, in order (the first that fires decides):

1. ``error_rate`` rollback: with at least ``min_calls_per_arm`` calls on each version, the lower end of
   the error-rate difference's confidence sequence (level ``alpha_rollback / 2``) is above
   ``max_error_rate_diff``.
2. ``latency_ratio`` rollback: the candidate's mean call latency is above ``max_latency_ratio`` times
   serving's (same minimum calls).
3. ``min_samples`` hold: either version has fewer than ``min_samples_per_arm`` rewards.
4. ``reward_worse`` rollback: the upper end of the reward difference's confidence sequence (level
   ``alpha_rollback / 2``) is below ``-rollback_margin``.
5. Before the last stage: ``stage_samples`` ramp once the candidate has ``min_samples_per_stage``
   rewards in this stage, else ``stage_samples`` hold.
6. At the last stage: ``reward_better`` promotion when the lower end of the reward difference's sequence
   (level ``alpha_promote``) is above ``-promotion_margin``, else ``reward_undecided`` hold.

Guarantees (``processors.release.sequential``): a candidate whose mean reward is at least serving's minus
``rollback_margin`` and whose error rate exceeds serving's by at most ``max_error_rate_diff`` is rolled
back by rules 1 and 4 with probability at most ``alpha_rollback`` over the whole release, however long it
runs; a candidate whose mean reward is below serving's minus ``promotion_margin`` is promoted with
probability at most ``alpha_promote``. The latency guard carries no such bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from processors.release.arms import ArmArrays
from processors.release.plan import ReleasePlan
from processors.release.sequential import Interval, mean_interval, rate_interval

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class Rule(IntEnum):
    """What decided; the action follows from the rule."""

    ERROR_RATE = 1
    LATENCY_RATIO = 2
    MIN_SAMPLES = 3
    REWARD_WORSE = 4
    STAGE_RAMP = 5
    STAGE_HOLD = 6
    REWARD_BETTER = 7
    REWARD_UNDECIDED = 8

    @property
    def action(self) -> str:
        return RULE_ACTIONS[self]

    @property
    def label(self) -> str:
        return RULE_LABELS[self]


RULE_ACTIONS: dict[Rule, str] = {
    Rule.ERROR_RATE: "rollback", Rule.LATENCY_RATIO: "rollback", Rule.MIN_SAMPLES: "hold",
    Rule.REWARD_WORSE: "rollback", Rule.STAGE_RAMP: "ramp", Rule.STAGE_HOLD: "hold",
    Rule.REWARD_BETTER: "promote", Rule.REWARD_UNDECIDED: "hold",
}
RULE_LABELS: dict[Rule, str] = {
    Rule.ERROR_RATE: "error_rate", Rule.LATENCY_RATIO: "latency_ratio", Rule.MIN_SAMPLES: "min_samples",
    Rule.REWARD_WORSE: "reward_worse", Rule.STAGE_RAMP: "stage_samples", Rule.STAGE_HOLD: "stage_samples",
    Rule.REWARD_BETTER: "reward_better", Rule.REWARD_UNDECIDED: "reward_undecided",
}
ROLLBACK_RULES = (Rule.ERROR_RATE, Rule.LATENCY_RATIO, Rule.REWARD_WORSE)


@dataclass(frozen=True)
class Evaluation:
    """The rule that fired for each stream, and the intervals and ratio it was decided on."""

    rule: IntArray
    reward_promote: Interval  # level alpha_promote
    reward_rollback: Interval  # level alpha_rollback / 2
    errors: Interval  # level alpha_rollback / 2
    latency_ratio: FloatArray


def evaluate(
    plan: ReleasePlan, serving: ArmArrays, candidate: ArmArrays, stage: npt.ArrayLike,
    stage_start_rewards: npt.ArrayLike,
) -> Evaluation:
    """Apply the rules to arrays of streams (``stage``: index into ``plan.ramp``; ``stage_start_rewards``:
    the candidate's reward count when its stage began)."""
    g, r = plan.guard_rails, plan.reward
    s, c = serving, candidate
    half_rollback = g.alpha_rollback / 2.0
    promote_iv = mean_interval(s.rewards, s.reward_total, s.reward_total_sq,
                               c.rewards, c.reward_total, c.reward_total_sq,
                               alpha=g.alpha_promote, tau=r.tau, variance_floor=r.variance_floor)
    rollback_iv = mean_interval(s.rewards, s.reward_total, s.reward_total_sq,
                                c.rewards, c.reward_total, c.reward_total_sq,
                                alpha=half_rollback, tau=r.tau, variance_floor=r.variance_floor)
    error_iv = rate_interval(s.calls, s.errors, c.calls, c.errors, alpha=half_rollback, tau=g.error_tau)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(s.latency_ms_total > 0,
                         (c.latency_ms_total / np.maximum(c.calls, 1)) / (s.latency_ms_total / np.maximum(s.calls, 1)),
                         np.nan)
    enough_calls = (s.calls >= g.min_calls_per_arm) & (c.calls >= g.min_calls_per_arm)
    enough_rewards = (s.rewards >= g.min_samples_per_arm) & (c.rewards >= g.min_samples_per_arm)
    last_stage = np.asarray(stage) >= len(plan.ramp) - 1
    stage_done = c.rewards - np.asarray(stage_start_rewards, dtype=np.float64) >= g.min_samples_per_stage
    rule = np.select(
        [
            enough_calls & (error_iv.low > g.max_error_rate_diff),
            enough_calls & (ratio > g.max_latency_ratio),
            ~enough_rewards,
            rollback_iv.high < -r.rollback_margin,
            ~last_stage & stage_done,
            ~last_stage,
            promote_iv.low > -r.promotion_margin,
        ],
        [Rule.ERROR_RATE, Rule.LATENCY_RATIO, Rule.MIN_SAMPLES, Rule.REWARD_WORSE, Rule.STAGE_RAMP,
         Rule.STAGE_HOLD, Rule.REWARD_BETTER],
        default=Rule.REWARD_UNDECIDED,
    ).astype(np.int64)
    return Evaluation(rule, promote_iv, rollback_iv, error_iv, ratio)
