"""The controller on synthetic reward streams, 2000 seeded releases per scenario, monitored at every step:
false rollbacks and false promotions stay within the plan's alpha; real differences are acted on.

Each release sees 20 sessions a step for 400 steps (8000 sessions), rewards Bernoulli(0.5) on serving.
The bounds allow three binomial standard errors above alpha for the finite number of releases; the
observed rates are printed (pytest -s) and lie well below alpha.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from processors.release.arms import ArmStats
from processors.release.controller import apply as apply_decision
from processors.release.controller import decide, initial_state, start_decision
from processors.release.plan import ReleasePlan, load_plan
from processors.release.rules import Rule, evaluate
from schemas.local_paths import DEPLOY_CONFIG_DIR
from tests.processors.release.simulation import PROMOTED, ROLLED_BACK, RUNNING, Outcome, simulate

PLAN = load_plan(DEPLOY_CONFIG_DIR / "release.yaml")
SEEDS, STEPS, BATCH = 2000, 400, 20
ALPHA_PROMOTE = PLAN.guard_rails.alpha_promote
ALPHA_ROLLBACK = PLAN.guard_rails.alpha_rollback


def _bound(alpha: float) -> float:
    return alpha + 3 * math.sqrt(alpha * (1 - alpha) / SEEDS)


def _run(rate: Callable[[int], float], plan: ReleasePlan = PLAN, seed: int = 0, **kw: float) -> Outcome:
    out = simulate(plan, seeds=SEEDS, steps=STEPS, batch=BATCH, serving_rate=0.5, candidate_rate=rate, seed=seed,
                   **kw)
    print(f"promoted {out.rate(PROMOTED):.4f}  rolled back {out.rate(ROLLED_BACK):.4f}  "
          f"running {out.rate(RUNNING):.4f}  median steps {np.median(out.steps):.0f}")
    return out


def test_equal_versions_are_rarely_promoted_and_rarely_rolled_back() -> None:
    out = _run(lambda _step: 0.5)
    assert out.rate(ROLLED_BACK) <= _bound(ALPHA_ROLLBACK)  # false rollback
    assert out.rate(PROMOTED) <= _bound(ALPHA_PROMOTE)  # false promotion (promotion_margin 0: must be better)
    assert out.rate(ROLLED_BACK) > 0 or out.rate(PROMOTED) > 0  # the rates are measured, not vacuous


def test_a_better_candidate_is_promoted_and_never_rolled_back() -> None:
    out = _run(lambda _step: 0.6, seed=1)
    assert out.rate(ROLLED_BACK) <= _bound(ALPHA_ROLLBACK)
    assert out.rate(PROMOTED) >= 0.95
    assert (out.max_stage[out.status == PROMOTED] == len(PLAN.ramp) - 1).all()  # through every stage


def test_a_worse_candidate_is_rolled_back_and_never_promoted() -> None:
    out = _run(lambda _step: 0.4, seed=2)
    assert out.rate(PROMOTED) <= _bound(ALPHA_PROMOTE)
    assert out.rate(ROLLED_BACK) >= 0.95
    assert (out.rule[out.status == ROLLED_BACK] == Rule.REWARD_WORSE).all()


def test_a_slowly_degrading_candidate_is_never_promoted_and_is_rolled_back() -> None:
    """Equal at first, then 0.15 worse by the end: never better, so any promotion is false."""
    out = _run(lambda step: 0.5 - 0.15 * step / STEPS, seed=3)
    assert out.rate(PROMOTED) <= _bound(ALPHA_PROMOTE)
    assert out.rate(ROLLED_BACK) >= 0.9


def test_a_candidate_with_more_errors_is_rolled_back_on_errors() -> None:
    out = _run(lambda _step: 0.5, seed=4, candidate_errors=0.08)
    assert out.rate(ROLLED_BACK) >= 0.95
    assert (out.rule[out.status == ROLLED_BACK] == Rule.ERROR_RATE).mean() >= 0.95


def test_a_non_inferiority_plan_promotes_equal_versions_but_not_worse_ones() -> None:
    """promotion_margin 0.1: "not worse by more than 0.1" is enough. Equal versions are then rightly
    promoted; one 0.15 worse is promoted at most alpha_promote of the time."""
    lenient = load_plan({**PLAN.model_dump(mode="json"), "reward": {"promotion_margin": 0.1}})
    assert _run(lambda _step: 0.5, lenient, seed=5).rate(PROMOTED) >= 0.9
    assert _run(lambda _step: 0.35, lenient, seed=6).rate(PROMOTED) <= _bound(ALPHA_PROMOTE)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_simulation_runs_the_controllers_rules(seed: int) -> None:
    """The vectorised rules the simulation applies are the ones ``decide`` applies to one release."""
    rng = np.random.default_rng(seed)
    state = initial_state("m", PLAN, 1)
    state = apply_decision(state, start_decision(state, 2, "sim"))
    for _ in range(50):
        n_s, n_c = (int(x) for x in rng.integers(0, 400, 2))
        ws, wc = int(rng.binomial(n_s, 0.5)), int(rng.binomial(n_c, rng.uniform(0.3, 0.7)))
        s = ArmStats(n_s, ws, ws, n_s, int(rng.binomial(n_s, 0.02)), 200.0 * n_s)
        c = ArmStats(n_c, wc, wc, n_c, int(rng.binomial(n_c, 0.05)), 200.0 * rng.uniform(0.8, 2.0) * n_c)
        stage = int(rng.integers(0, len(PLAN.ramp)))
        probe = replace(state, serving=s, candidate=c, stage=stage)
        rule = Rule(int(evaluate(PLAN, s.arrays(), c.arrays(), stage, 0).rule))
        assert decide(probe).rule == rule.label and decide(probe).action == rule.action
