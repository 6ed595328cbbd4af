"""The audit's fifth check on chDB: every feedback is used by exactly the rewards its config admits, or
recorded late, unmatched or invalid; none silently dropped. And `tokentrail replay --feedback`: rewards
re-derived by event time beside the stream's, differing exactly where late feedback landed."""

from __future__ import annotations

import pytest
from clickhouse_connect.driver.client import Client

from sinks.audit import check_feedback_accounting, run_audit
from sinks.feedback_audit import feedback_accounting
from sinks.replay import format_feedback_replay, replay_feedback
from sinks.store import write_records
from tokentrail.cli import main as cli_main

from .feedback_scenario import CFG, feedback_scenario


def test_feedback_as_the_stream_left_it_passes_and_every_check_still_passes(ch: Client) -> None:
    scenario = feedback_scenario()
    write_records(ch, scenario.events)
    result = feedback_accounting(ch, CFG)
    assert result.passed, result.failures
    assert result.checked == len(scenario.rewards) + len(scenario.feedback)
    # Feedback rewards name feedback, not raw scores: score reviewability leaves them to this check.
    results = {r.key: r for r in run_audit(ch)}
    assert list(results)[-1] == "feedback_accounting"
    assert all(r.passed for r in results.values()), {k: r.failures[:2] for k, r in results.items()}


def test_feedback_neither_used_nor_recorded_late_fails_naming_it(ch: Client) -> None:
    scenario = feedback_scenario()
    write_records(ch, scenario.without(scenario.letters["late"]))
    result = feedback_accounting(ch, CFG)
    late_id = scenario.feedback["late"]["event_id"]
    r1_reward = scenario.rewards[scenario.rollout_ids[1]]["event_id"]
    assert result.failing_ids() == sorted([late_id, r1_reward])
    reasons = {f.id: f.reason for f in result.failures}
    assert "silently dropped" in reasons[late_id]
    assert late_id in reasons[r1_reward] and "not admitted and not recorded late" in reasons[r1_reward]
    # Without the config, the structural part still finds the dropped feedback.
    assert check_feedback_accounting(ch).failing_ids() == [late_id]


def test_a_reward_that_admits_too_little_or_foreign_feedback_fails(ch: Client) -> None:
    scenario = feedback_scenario()
    r0, r1 = (scenario.rewards[r] for r in scenario.rollout_ids[:2])
    thumb, rating = scenario.feedback["thumb"]["event_id"], scenario.feedback["rating"]["event_id"]
    emptied = {**r0, "components_json": r0["components_json"].replace(f'"{thumb}"', ""), "score_ids": []}
    foreign = {**r1, "components_json": r1["components_json"].replace(f'"{rating}"', f'"{rating}","{thumb}"')}
    events = [(n, emptied if r is r0 else foreign if r is r1 else r) for n, r in scenario.events]
    write_records(ch, events)
    result = feedback_accounting(ch, CFG)
    reasons: dict[str, str] = {}
    for failure in result.failures:
        reasons[failure.id] = reasons.get(failure.id, "") + failure.reason
    assert "not admitted and not recorded late" in reasons[r0["event_id"]]
    assert "names another rollout" in reasons[r1["event_id"]]


def test_the_ghost_feedback_without_its_unmatched_record_fails(ch: Client) -> None:
    scenario = feedback_scenario()
    write_records(ch, scenario.without(scenario.letters["ghost"]))
    result = feedback_accounting(ch, CFG)
    ghost = scenario.feedback["ghost"]["event_id"]
    assert result.failing_ids() == [ghost]
    assert "not recorded unmatched" in result.failures[0].reason


def test_replay_admits_the_late_feedback_beside_the_originals(ch: Client, chdb_dsn: str,
                                                              capsys: pytest.CaptureFixture[str],
                                                              tmp_path: object) -> None:
    scenario = feedback_scenario()
    write_records(ch, scenario.events)
    result = replay_feedback(ch, CFG)
    rows = {row.rollout_id: row for row in result.rows}
    assert set(rows) == set(scenario.rollout_ids)
    late_id = scenario.feedback["late"]["event_id"]
    changed = {rid for rid, row in rows.items() if row.changed}
    assert changed == {scenario.rollout_ids[1]}  # exactly where late feedback landed
    r1 = rows[scenario.rollout_ids[1]]
    assert r1.late_admitted == [late_id] and r1.replayed["reward"] == 0.0  # latest: the REJECTED outcome
    assert r1.originals == [scenario.rewards[scenario.rollout_ids[1]]]
    assert r1.originals[0]["reward"] == pytest.approx(0.8)
    assert all(row.replayed["event_id"] != o["event_id"] for row in rows.values() for o in row.originals)
    assert result.invalid == [scenario.feedback["invalid"]["event_id"]]  # stored, refused, not replayed
    assert rows[scenario.rollout_ids[0]].late_admitted == []
    table = format_feedback_replay(result)
    assert "changed 1" in table and late_id in table

    # The command: side by side, written to ClickHouse, and the audit still passes (replays are not the
    # stream's accounting).
    from pathlib import Path

    import yaml
    config_path = Path(str(tmp_path)) / "feedback.yaml"
    config_path.write_text(yaml.safe_dump(CFG.model_dump(mode="json")))
    args = ["--dsn", chdb_dsn, "--database", ch.database, "--feedback", "--feedback-config", str(config_path)]
    assert cli_main(["replay", *args, "--to", "clickhouse"]) == 0
    out = capsys.readouterr().out
    assert late_id in out and "inserted into ClickHouse" in out
    stored = ch.query("SELECT count() FROM rewards FINAL WHERE JSONExtractBool(components_json, 'replay')")
    assert stored.result_rows[0][0] == len(scenario.rollout_ids)
    assert feedback_accounting(ch, CFG).passed
