"""The report's release section on chDB: versions in traffic over time, reward per version with its interval,
each decision (made by the real release core) on the timeline and in the table, and the trainer's resume after a
rollback (TrainerStep v3)."""

from __future__ import annotations

import math

from clickhouse_connect.driver.client import Client

from processors.release.controller import initial_state, manual_decision, pin_decision, start_decision
from processors.release.events import decision_record
from processors.release.plan import load_plan
from schemas.builders import make_call
from sinks.release_report import call_shares, normal_interval, release_section
from sinks.report import build_report
from sinks.store import write_records
from trainer_consumer.events import trainer_resume_record
from trainer_consumer.rollback_resume import resume_due

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


def test_pinned_traffic_is_reported_per_pin_and_every_arm_is_checked_against_the_decision_log(ch: Client) -> None:
    events, _group, members = pipeline_events(8, sample_config(merge=False, pack=False))
    model = next(r for n, r in events if n == "CallRecord")["versions"]["model"]
    state = initial_state(model, PLAN, serving_version=0)
    start, state = decision_record(state, start_decision(state, 1, "demo", plan=PLAN), created_at_us=1)
    pin, state = decision_record(state, pin_decision(state, "eval", 0, "demo"), created_at_us=2)
    rollback, state = decision_record(state, manual_decision(state, "rollback", "demo", "worse"), created_at_us=3)

    def release(arm: str, sequence: int, label: str | None = None) -> dict:
        return {"release_id": start["release_id"], "decision_sequence": sequence, "arm": arm, "pin_label": label}

    # The first rollout (answered right) is evaluation traffic pinned to v0; the others serving traffic.
    pinned_rollout = members[0]["rollout_id"]
    for name, record in events:
        if name == "CallRecord":
            record["release"] = release("pinned", 1, "eval") if record["rollout_id"] == pinned_rollout else \
                release("serving", 0)
    routed = [(1, release("candidate", 0)), (0, release("candidate", 0)),  # the second: served by serving's weights
              (0, release("serving", 2)), (1, release("candidate", 2)),  # after the rollback there is no candidate
              (0, release("serving", 9))]  # a decision that is not stored
    extra = []
    for i, (version, rel) in enumerate(routed):
        call = make_call(f"routed-{i}", "a0", 0, [1, 2], [3], policy_version=version, release=rel)
        call["versions"]["model"] = model
        extra.append(("CallRecord", call))
    write_records(ch, [*events, *extra, *(("ReleaseDecision", d) for d in (start, pin, rollback))])
    section = release_section(ch, lambda _fig: "<img>", _table)

    pinned = section[section.index("<h3>Pinned (evaluation) traffic"):]
    calls_of_pinned = sum(1 for n, r in events if n == "CallRecord" and r["rollout_id"] == pinned_rollout)
    assert f"<tr><td>{model}</td><td>eval</td><td>v0</td><td>{calls_of_pinned}</td><td>1</td><td>1</td><td>1.0</td>" \
        in pinned
    # Left out of the versions' rewards: the three other rollouts of v0 (one of them answered right).
    assert "<tr><td>0</td><td>0.3333333333333333</td>" in section and "</td><td>3</td></tr>" in section
    arms = section[section.index("<h3>Release arms on the calls"):]
    assert "2 call(s) were served another version than their arm's" in arms
    short = start["release_id"][:12]
    assert f"<tr><td>{short}</td><td>candidate</td><td>3</td><td>0</td><td>2</td></tr>" in arms
    assert f"<tr><td>{short}</td><td>pinned</td><td>{calls_of_pinned}</td><td>0</td><td>0</td></tr>" in arms
    serving_calls = sum(1 for n, r in events if n == "CallRecord") - calls_of_pinned + 2
    assert f"<tr><td>{short}</td><td>serving</td><td>{serving_calls}</td><td>1</td><td>0</td></tr>" in arms


def _table(headers: list[str], rows: list[tuple]) -> str:
    return "".join("<tr>" + "".join(f"<td>{v}</td>" for v in row) + "</tr>" for row in rows)
