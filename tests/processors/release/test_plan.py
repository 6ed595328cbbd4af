"""The release plan: the committed file loads, its id follows meaning not formatting, bad plans are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from processors.errors import ConfigError
from processors.release.plan import ReleasePlan, load_plan
from schemas.local_paths import DEPLOY_CONFIG_DIR


def test_the_committed_plan_loads_with_its_guard_rails() -> None:
    plan = load_plan(DEPLOY_CONFIG_DIR / "release.yaml")
    assert plan.ramp == (0.05, 0.25, 0.5)
    assert plan.guard_rails.alpha_promote == plan.guard_rails.alpha_rollback == 0.05
    assert len(plan.plan_id) == 16


def test_the_id_changes_with_meaning_only() -> None:
    plan = load_plan("ramp: [0.05, 0.5]\nguard_rails: {min_samples_per_arm: 50}\n")
    same = load_plan({"guard_rails": {"min_samples_per_arm": 50, "alpha_promote": 0.05}, "ramp": [0.05, 0.5],
                      "version": 1})
    assert plan.plan_id == same.plan_id
    assert load_plan("ramp: [0.05, 0.6]\nguard_rails: {min_samples_per_arm: 50}\n").plan_id != plan.plan_id
    assert isinstance(load_plan(plan), ReleasePlan)


@pytest.mark.parametrize(("text", "message"), [
    ("ramp: [0.25, 0.05]\n", "strictly increasing"),
    ("ramp: [0.05, 1.0]\n", "strictly between 0 and 1"),
    ("ramp: []\n", "ramp"),
    ("guard_rails: {alpha_promote: 0}\n", "alpha_promote"),
    ("pinned: {eval: -1}\n", "pinned version"),
    ("reward: {tau: 0}\n", "reward.tau"),
    ("surprise: 1\n", "surprise"),
    ("- a list\n", "expected a mapping"),
])
def test_a_bad_plan_is_refused_with_the_field_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_plan(text)


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read ReleasePlan file"):
        load_plan(tmp_path / "missing.yaml")
