"""Many synthetic releases at once: Bernoulli rewards, error-prone calls with gamma latencies, ramps.

Each step gives every still-running release ``batch`` new sessions, routed to the candidate with the
current stage's fraction; each session yields one reward and one call. After each step the controller's
rules (``processors.release.rules.evaluate``, the code ``decide`` runs) are applied to every release, so
the releases are monitored continuously, at every step, as the controller would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from processors.release.arms import ArmArrays
from processors.release.plan import ReleasePlan
from processors.release.rules import ROLLBACK_RULES, Rule, evaluate

FloatArray = npt.NDArray[np.float64]
RateAt = Callable[[int], float]  # step -> the candidate's success (reward 1) probability

RUNNING, PROMOTED, ROLLED_BACK = 0, 1, 2


@dataclass(frozen=True)
class Outcome:
    status: npt.NDArray[np.int64]  # RUNNING | PROMOTED | ROLLED_BACK per release
    rule: npt.NDArray[np.int64]  # the rule that ended it (0 while running)
    steps: npt.NDArray[np.int64]  # steps until it ended
    max_stage: npt.NDArray[np.int64]

    def rate(self, status: int) -> float:
        return float(np.mean(self.status == status))


def _zeros(n: int) -> FloatArray:
    return np.zeros(n, dtype=np.float64)


def simulate(
    plan: ReleasePlan, *, seeds: int, steps: int, batch: int, serving_rate: float, candidate_rate: RateAt,
    serving_errors: float = 0.02, candidate_errors: float = 0.02, latency_ms: float = 200.0,
    candidate_latency_ms: float | None = None, seed: int = 0,
) -> Outcome:
    rng = np.random.default_rng(seed)
    ramp = np.asarray(plan.ramp)
    totals = {arm: [_zeros(seeds) for _ in range(6)] for arm in ("s", "c")}
    stage = np.zeros(seeds, dtype=np.int64)
    stage_start = _zeros(seeds)
    status = np.zeros(seeds, dtype=np.int64)
    rule = np.zeros(seeds, dtype=np.int64)
    ended = np.full(seeds, steps, dtype=np.int64)
    cand_latency = latency_ms if candidate_latency_ms is None else candidate_latency_ms
    for step in range(steps):
        live = status == RUNNING
        if not live.any():
            break
        n_c = np.where(live, rng.binomial(batch, ramp[stage]), 0)
        n_s = np.where(live, batch - n_c, 0)
        for arm, n, rate, err, lat in (("s", n_s, serving_rate, serving_errors, latency_ms),
                                       ("c", n_c, candidate_rate(step), candidate_errors, cand_latency)):
            wins = rng.binomial(n, rate)
            t = totals[arm]
            t[0] += n  # rewards
            t[1] += wins  # sum (Bernoulli: sum of squares is the sum)
            t[2] += wins
            t[3] += n  # calls
            t[4] += rng.binomial(n, err)
            t[5] += np.where(n > 0, rng.gamma(np.maximum(n, 1), lat), 0.0)  # sum of n exponential latencies
        ev = evaluate(plan, ArmArrays(*totals["s"]), ArmArrays(*totals["c"]), stage, stage_start)
        ramps = live & (ev.rule == Rule.STAGE_RAMP)
        stage_start = np.where(ramps, totals["c"][0], stage_start)
        stage = np.where(ramps, stage + 1, stage)
        promoted = live & (ev.rule == Rule.REWARD_BETTER)
        rolled_back = live & np.isin(ev.rule, [int(r) for r in ROLLBACK_RULES])
        status = np.where(promoted, PROMOTED, np.where(rolled_back, ROLLED_BACK, status))
        rule = np.where(promoted | rolled_back, ev.rule, rule)
        ended = np.where(promoted | rolled_back, step + 1, ended)
    return Outcome(status, rule, ended, stage)
