"""The dashboard's release panels (issue 22 block of sinks/dashboards.py) on chDB: versions' share of calls,
the decisions table and the reward per version with its interval."""

from __future__ import annotations

import math
from typing import Any

from clickhouse_connect.driver.client import Client

from processors.release.controller import initial_state, manual_decision, start_decision
from processors.release.events import decision_record
from processors.release.plan import load_plan
from sinks import dashboards
from sinks.store import write_records

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
    write_records(ch, [*events, ("ReleaseDecision", start), ("ReleaseDecision", rollback)])

    (share,) = _panel(ch, "Release: share of calls by policy version")
    assert share["version"] == "v0" and share["share"] == 1.0
    decisions = _panel(ch, "Release decisions")
    assert [(d["sequence"], d["action"], d["share_after"]) for d in decisions] == [(1, "rollback", 0.0),
                                                                                  (0, "start", 0.25)]
    (reward,) = _panel(ch, "Release: raw reward per version (95% interval)")
    # Two of the four rollouts answered right: mean 0.5, sample variance 1/3.
    assert reward["policy_version"] == "0" and reward["rollouts"] == 4 and reward["mean_raw_reward"] == 0.5
    assert math.isclose(reward["high"] - reward["mean_raw_reward"], 1.96 * math.sqrt(1 / 3 / 4), rel_tol=1e-6)
