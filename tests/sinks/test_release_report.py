"""The report's release section on chDB: versions in traffic over time, reward per version with its interval,
each decision (made by the real release core) on the timeline and in the table, and the trainer's resume after a
rollback (TrainerStep v3)."""

from __future__ import annotations

import math

from clickhouse_connect.driver.client import Client

from processors.release.controller import initial_state, manual_decision, start_decision
from processors.release.events import decision_record
from processors.release.plan import load_plan
from sinks.release_report import call_shares, normal_interval
from sinks.report import build_report
from sinks.store import write_records
from trainer_consumer.events import trainer_resume_record
from trainer_consumer.release_follower import resume_due

from .pipeline_data import pipeline_events, sample_config

PLAN = load_plan({"ramp": [0.25]})


def test_call_shares_and_intervals() -> None:
    buckets, shares = call_shares([(1, 0, 3), (1, 1, 1), (2, 1, 2)])
    assert buckets == [1, 2] and shares == {0: [0.75, 0.0], 1: [0.25, 1.0]}
    low, high = normal_interval(0.5, 0.25, 100)
    assert math.isclose(low, 0.5 - 1.96 * 0.05, abs_tol=1e-3) and math.isclose(high, 0.5 + 1.96 * 0.05, abs_tol=1e-3)
    assert all(math.isnan(x) for x in normal_interval(1.0, None, 1))


def test_report_shows_versions_rewards_and_decisions(ch: Client) -> None:
    events, _group, members = pipeline_events(7, sample_config(merge=False, pack=False))
    state = initial_state("tokentrail-tiny", PLAN, serving_version=0)
    t0 = min(r["timings"]["received_at_us"] for n, r in events if n == "CallRecord")
    start, state = decision_record(state, start_decision(state, 1, "demo", plan=PLAN), created_at_us=t0)
    rollback, state = decision_record(state, manual_decision(state, "rollback", "demo", "worse"),
                                      created_at_us=t0 + 5_000_000)
    # The trainer's answer to the rollback (TrainerStep v3): v1's line abandoned, v0's weights published as v3.
    resume = resume_due([start, rollback], current_version=2, handled_sequence=-1)
    assert resume is not None
    resumed = trainer_resume_record("run-1", 7, 2, 3, resume, created_at_us=t0 + 6_000_000)
    write_records(ch, [*events, ("ReleaseDecision", start), ("ReleaseDecision", rollback), ("TrainerStep", resumed)])
    html = build_report(ch, audit=False)
    section = html[html.index("<h2>Release: versions in traffic"):]
    section = section[: section.index("<h2>", 5)]
    assert section.count("<img") == 2  # the timeline and the reward per version
    assert "<td>start</td>" in section and "<td>rollback</td>" in section and "<td>worse</td>" in section
    # The four rollouts were served by version 0; two answered right (raw reward 1), two did not.
    assert all(r["policy_versions"] == [0] for r in members)
    assert "<tr><td>0</td><td>0.5</td><td>[" in section and "</td><td>4</td></tr>" in section
    resumes = section[section.index("<h3>Trainer resumes after a rollback</h3>"):]
    assert "<td>run-1</td><td>v2</td><td>v0</td><td>v3</td><td>v1</td><td>1</td>" in resumes
    assert "operator rollback (manual): worse" in resumes
