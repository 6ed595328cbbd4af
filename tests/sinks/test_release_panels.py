"""The dashboard's release panels (issue 22 block of sinks/dashboards.py) on chDB: versions' share of calls,
the decisions table, the reward per version with its interval, and the trainer's resumes after a rollback."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from clickhouse_connect.driver.client import Client

from processors.release.controller import initial_state, manual_decision, start_decision
from processors.release.events import decision_record
from processors.release.plan import load_plan
from schemas.builders import make_call
from sinks import dashboards
from sinks.store import write_records
from trainer_consumer.batching import Batch
from trainer_consumer.events import trainer_resume_record, trainer_step_record
from trainer_consumer.rollback_resume import resume_due

from .pipeline_data import pipeline_events, sample_config


def _panel(ch: Client, title: str) -> list[dict[str, Any]]:
    panel = next(p for p in dashboards.PANELS if p.title == title)
    result = ch.query(dashboards.expand_macros(panel.sql, interval_s=10**9))  # one bucket holds everything
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def test_release_panels_show_versions_decisions_and_rewards(ch: Client) -> None:
    events, _group, _members = pipeline_events(3, sample_config(merge=False, pack=False))
    plan = load_plan({"ramp": [0.25]})
    state = initial_state("tokentrail-tiny", plan, serving_version=0)
    start, state = decision_record(state, start_decision(state, 1, "demo", plan=plan), created_at_us=1)
    rollback, state = decision_record(state, manual_decision(state, "rollback", "demo", "worse"), created_at_us=2)
    resume = resume_due([start, rollback], current_version=1, handled_sequence=-1)
    assert resume is not None
    training_step = trainer_step_record("run-1", 4, 1, 2, Batch([], Counter(), []), None, created_at_us=3)
    resumed = trainer_resume_record("run-1", 4, 1, 2, resume, created_at_us=4)
    write_records(ch, [*events, ("ReleaseDecision", start), ("ReleaseDecision", rollback),
                       ("TrainerStep", training_step), ("TrainerStep", resumed)])

    (share,) = _panel(ch, "Release: share of calls by policy version")
    assert share["version"] == "v0" and share["share"] == 1.0
    decisions = _panel(ch, "Release decisions")
    assert [(d["sequence"], d["action"], d["share_after"]) for d in decisions] == [(1, "rollback", 0.0),
                                                                                  (0, "start", 0.25)]
    (reward,) = _panel(ch, "Release: raw reward per version (95% interval)")
    # Two of the four rollouts answered right: mean 0.5, sample variance 1/3.
    assert reward["policy_version"] == "0" and reward["rollouts"] == 4 and reward["mean_raw_reward"] == 0.5
    assert math.isclose(reward["high"] - reward["mean_raw_reward"], 1.96 * math.sqrt(1 / 3 / 4), rel_tol=1e-6)
    (resumed_row,) = _panel(ch, "Trainer resumes after a release rollback")  # the training step is not one
    assert (resumed_row["weights_before"], resumed_row["resumed_from"], resumed_row["published_as"],
            resumed_row["rolled_back"]) == ("v1", "v0", "v2", "v1")
    assert resumed_row["resume_decision_id"] == rollback["event_id"] and resumed_row["run_id"] == "run-1"


def test_pinned_calls_have_their_own_panel_and_stay_out_of_the_shares(ch: Client) -> None:
    def call(i: int, version: int, release: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        return "CallRecord", make_call(f"r{i}", "a0", 0, [1, 2], [3], policy_version=version, release=release,
                                       status="ERROR" if i == 2 else "OK")

    pinned = {"release_id": "rel", "decision_sequence": 1, "arm": "pinned", "pin_label": "eval-suite"}
    serving = {**pinned, "arm": "serving", "pin_label": None}
    write_records(ch, [call(0, 0, serving), call(1, 3, pinned), call(2, 3, pinned), call(3, 0, None)])
    (row,) = _panel(ch, "Release: pinned (evaluation) traffic per pin")
    assert (row["pin_label"], row["version"], row["calls"], row["rollouts"], row["errors"]) == ("eval-suite", "v3",
                                                                                                2, 2, 1)
    (share,) = _panel(ch, "Release: share of calls by policy version")  # v3 served only evaluation traffic
    assert share["version"] == "v0" and share["share"] == 1.0
