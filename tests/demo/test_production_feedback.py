"""The simulated users' judgement in ``demo --production`` (pure): what each kind of feedback says about an
answer, the edit distance an EDITED outcome carries, and the plan of delays (late ones past the window)."""

from __future__ import annotations

import random

import pytest

from demo.production import demo_baseline_config, demo_feedback_config
from demo.production_users import KINDS, edit_distance, feedback_fields, plan_feedback, unknown_response_id
from processors.baselines.config import BaselineConfig
from processors.baselines.windows import KeyBaselines, Member
from processors.feedback.config import FeedbackRewardConfig
from schemas.feedback import call_id_of_response

pytestmark = pytest.mark.e2e


def test_edit_distance_is_the_share_of_the_longer_text_changed() -> None:
    assert edit_distance("blue", "blue") == 0.0
    assert edit_distance("blus", "blue") == 0.25
    assert edit_distance("", "blue") == 1.0
    assert edit_distance("kitten", "sitting") == pytest.approx(3 / 7)


@pytest.mark.parametrize(("answer", "fields"), [
    ("Blue", {"BINARY": {"binary": True}, "RATING": {"rating": 5.0, "rating_scale": [1.0, 5.0]},
              "OUTCOME": {"outcome": "ACCEPTED"}}),
    ("blus", {"BINARY": {"binary": False}, "RATING": {"rating": 3.0, "rating_scale": [1.0, 5.0]},
              "OUTCOME": {"outcome": "EDITED", "edit_distance": 0.25}}),
    ("", {"BINARY": {"binary": False}, "RATING": {"rating": 1.0, "rating_scale": [1.0, 5.0]},
          "OUTCOME": {"outcome": "REJECTED"}}),
])
def test_each_kind_says_what_a_user_who_knows_the_answer_says(answer: str, fields: dict) -> None:
    for kind, expected in fields.items():
        assert feedback_fields(kind, answer, "blue") == expected
    task = feedback_fields("TASK_OUTCOME", answer, "blue")
    assert task["task_success"] is (answer.lower() == "blue") and task["details"]["wanted"] == "blue"


def test_the_plan_puts_late_feedback_past_the_window_and_the_rest_inside() -> None:
    rng = random.Random(7)
    plans = [plan_feedback("blus", "blue", rng, late_fraction=0.3, wait_s=20.0, lag_s=5.0) for _ in range(400)]
    late = [p for plan in plans for p in plan if p.late]
    timely = [p for plan in plans for p in plan if not p.late]
    assert all(len(plan) in (1, 2) and len({p.late for p in plan}) == 1 for plan in plans)  # a session is late or not
    assert 0.2 < sum(plan[0].late for plan in plans) / len(plans) < 0.4
    # All given inside the wait (replay by event time admits them); late ones arrive after the window.
    assert all(0.5 <= p.event_offset_s <= 0.35 * 20.0 for plan in plans for p in plan)
    assert all(p.delay_s >= 20.0 + 5.0 + 10.0 for p in late) and all(p.delay_s == p.event_offset_s for p in timely)
    assert {p.kind for p in timely} == set(KINDS) == {p.kind for p in late}


def test_the_demo_config_loads_and_an_unknown_response_id_is_well_formed() -> None:
    cfg = FeedbackRewardConfig.model_validate(demo_feedback_config(20.0, 5.0, 30.0))
    assert cfg.combine == "mean" and cfg.wait_s["TASK_OUTCOME"] == 20.0 and cfg.match_wait_s == 30.0
    assert call_id_of_response(unknown_response_id(1)) is not None  # the route accepts it; the join finds nothing
    assert unknown_response_id(1) != unknown_response_id(2)


def test_the_demos_baselines_scale_a_group_as_the_lab_demos_grpo_rewards() -> None:
    """Unscaled leave-one-out advantages of thumbs 1, 0, 0 would be 1, -0.5, -0.5: the demo divides them by
    the group's std (0.471), so feedback moves the policy as far per step as the verifier does in the lab."""
    cfg = BaselineConfig.model_validate(demo_baseline_config(15.0, 5.0))
    assert (cfg.window.size_s, cfg.watermark_lag_s, cfg.min_group_size, cfg.clip) == (15.0, 5.0, 3, (-5.0, 5.0))
    key = KeyBaselines(cfg, "cluster:x")
    for n, reward in enumerate((1.0, 0.0, 0.0)):
        key.add(Member(f"r{n}", f"session-{n}", f"w{n}", reward, 1_000_000 * (n + 1)))
    (window,) = key.tick(100_000_000)
    assert window.method == "GROUP"
    assert window.advantages == pytest.approx((2.1213, -1.0607, -1.0607), abs=1e-3)
