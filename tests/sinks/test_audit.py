"""The four audit checks: pass on clean data, fail naming the ids on each kind of damage; trace; report."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from clickhouse_connect.driver.client import Client

from schemas.tokens import pack_floats, pack_ids, unpack_floats, unpack_ids
from sinks.audit import run_audit
from sinks.audit_result import CheckResult
from sinks.report import build_report, rolling_reward
from sinks.store import write_records
from sinks.trace import TraceError, format_trace, trace_sample
from testkit.storage_records import Event, GroupEvents, GroupSpec, synthetic_group
from tokentrail.cli import main as cli_main


def clean_groups(n: int = 2) -> list[GroupEvents]:
    return [synthetic_group(GroupSpec(group_index=i, policy_version=i + 1, pack=True)) for i in range(n)]


def events_of(groups: list[GroupEvents]) -> list[Event]:
    return [e for g in groups for e in g.events]


def by_key(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.key: r for r in results}


def replace(events: list[Event], name: str, event_id: str, new: dict) -> list[Event]:
    return [(n, new if (n == name and r["event_id"] == event_id) else r) for n, r in events]


def test_clean_data_passes_every_check(ch: Client) -> None:
    write_records(ch, events_of(clean_groups()))
    results = by_key(run_audit(ch))
    assert all(r.passed for r in results.values()), {k: r.failures[:3] for k, r in results.items()}
    assert results["token_traceability"].checked == 28  # samples
    assert results["rollout_traceability"].checked == 8
    assert results["packing_preserves_weight"].checked == 16  # 8 credits x 2 sample configs
    assert "24 sampling calls" in results["token_traceability"].notes[0]


def test_sample_tokens_that_do_not_match_their_call_fail(ch: Client) -> None:
    events = events_of(clean_groups())
    sample = copy.deepcopy(next(r for n, r in events if n == "Sample" and r["kind"] == "CALL"))
    out_seg = next(s for s in sample["segments"] if s["source"] == "OUTPUT")
    ids = unpack_ids(sample["input_ids"]).copy()
    ids[out_seg["sample_start"] + 3] += 1  # one sampled token changed
    sample["input_ids"] = pack_ids(ids)
    write_records(ch, replace(events, "Sample", sample["event_id"], sample))
    result = by_key(run_audit(ch))["token_traceability"]
    assert not result.passed
    assert result.failing_ids() == [sample["event_id"]]
    assert "token ids differ from the call's sampled ids" in result.failures[0].reason


def test_a_changed_conditioning_prefix_fails(ch: Client) -> None:
    """Loss tokens intact, but the prompt tokens before them are not the call's real prompt."""
    events = events_of(clean_groups())
    sample = copy.deepcopy(next(r for n, r in events if n == "Sample" and r["kind"] == "CALL"))
    ids = unpack_ids(sample["input_ids"]).copy()
    ids[5] += 1  # inside the PROMPT segment, outside the loss
    sample["input_ids"] = pack_ids(ids)
    write_records(ch, replace(events, "Sample", sample["event_id"], sample))
    result = by_key(run_audit(ch))["token_traceability"]
    assert result.failing_ids() == [sample["event_id"]]
    assert "first difference at 5" in result.failures[0].reason


def test_a_loss_token_outside_every_output_segment_fails(ch: Client) -> None:
    events = events_of(clean_groups())
    sample = copy.deepcopy(next(r for n, r in events if n == "Sample" and r["kind"] == "CALL"))
    mask = bytearray(sample["loss_mask"])
    mask[0] = 1  # a prompt token in the loss: no call sampled it
    sample["loss_mask"] = bytes(mask)
    write_records(ch, replace(events, "Sample", sample["event_id"], sample))
    result = by_key(run_audit(ch))["token_traceability"]
    assert result.failing_ids() == [sample["event_id"]]
    assert "lie in OUTPUT segments" in result.failures[0].reason


def test_a_broken_delta_chain_fails_token_and_rollout_traceability(ch: Client) -> None:
    groups = clean_groups()
    missing_call = groups[0].call_ids[1]  # the base of call #2 of the first rollout
    events = [(n, r) for n, r in events_of(groups) if not (n == "CallRecord" and r["call_id"] == missing_call)]
    write_records(ch, events)
    results = by_key(run_audit(ch))
    token = results["token_traceability"]
    assert not token.passed
    assert any("prompt not reconstructable" in f.reason and "is not available" in f.reason for f in token.failures)
    assert any(
        f"call {missing_call} output" in f.reason and f.reason.endswith("call not in the calls table")
        for f in token.failures
    )
    rollout = results["rollout_traceability"]
    rollout_event = next(r["event_id"] for n, r in events if n == "CompletedRollout" and missing_call in r["call_ids"])
    assert rollout.failing_ids() == [rollout_event]


def test_a_rollout_in_no_group_fails(ch: Client) -> None:
    groups = clean_groups()
    events = [(n, r) for n, r in events_of(groups) if not (n == "RolloutGroup" and r["group_id"] == groups[1].group_id)]
    write_records(ch, events)
    result = by_key(run_audit(ch))["rollout_traceability"]
    expected = sorted(
        r["event_id"] for n, r in events if n == "CompletedRollout" and r["rollout_id"] in groups[1].rollout_ids
    )
    assert result.failing_ids() == expected
    assert all("in no group record" in f.reason for f in result.failures)


def test_a_reward_with_no_score_fails(ch: Client) -> None:
    events = events_of(clean_groups())
    rewards = [r for n, r in events if n == "Reward"]
    dangling = {**rewards[0], "score_ids": ["0" * 32]}
    empty = {**rewards[1], "score_ids": []}
    events = replace(replace(events, "Reward", dangling["event_id"], dangling), "Reward", empty["event_id"], empty)
    write_records(ch, events)
    result = by_key(run_audit(ch))["score_reviewability"]
    assert result.failing_ids() == sorted([dangling["event_id"], empty["event_id"]])
    reasons = " ".join(f.reason for f in result.failures)
    assert "names scores not stored: ['" + "0" * 32 in reasons and "names no raw score" in reasons


def test_a_credit_naming_a_missing_reward_fails(ch: Client) -> None:
    events = events_of(clean_groups())
    credit = next(r for n, r in events if n == "Credit")
    write_records(ch, replace(events, "Credit", credit["event_id"], {**credit, "reward_id": "f" * 32}))
    result = by_key(run_audit(ch))["score_reviewability"]
    assert result.failing_ids() == [credit["event_id"]]


def test_an_edited_raw_score_fails(ch: Client) -> None:
    events = events_of(clean_groups())
    score = next(r for n, r in events if n == "Score")
    write_records(ch, events)
    write_records(ch, [("Score", {**score, "raw_json": '{"correct": true, "edited_by": "someone"}'})])
    write_records(ch, [("Score", {**score, "created_at_us": score["created_at_us"] + 5})])  # same content: fine
    result = by_key(run_audit(ch))["score_reviewability"]
    assert result.failing_ids() == [score["event_id"]]
    assert "2 different contents" in result.failures[0].reason


def test_packing_that_changes_a_rollouts_weight_fails(ch: Client) -> None:
    groups = clean_groups()
    events = events_of(groups)
    packed = copy.deepcopy(next(r for n, r in events if n == "Sample" and r["kind"] == "PACKED"))
    victim = packed["rollout_ids"][1]
    weights = unpack_floats(packed["weights"]).copy()
    for seg in packed["segments"]:
        if seg["rollout_id"] == victim:
            weights[seg["sample_start"] : seg["sample_start"] + seg["length"]] *= 2
    packed["weights"] = pack_floats(weights)
    write_records(ch, replace(events, "Sample", packed["event_id"], packed))
    result = by_key(run_audit(ch))["packing_preserves_weight"]
    credit = next(r for n, r in events if n == "Credit" and r["rollout_id"] == victim)
    assert result.failing_ids() == [credit["event_id"]]
    assert packed["event_id"] in result.failures[0].reason and "carry weight 2" in result.failures[0].reason


def test_a_packed_sample_that_drops_a_rollouts_tokens_fails(ch: Client) -> None:
    events = events_of(clean_groups())
    packed = copy.deepcopy(next(r for n, r in events if n == "Sample" and r["kind"] == "PACKED"))
    seg = next(s for s in packed["segments"] if s["source"] == "OUTPUT")
    weights = unpack_floats(packed["weights"]).copy()
    weights[seg["sample_start"] : seg["sample_start"] + seg["length"]] = 0.0  # one call's loss weight lost
    packed["weights"] = pack_floats(weights)
    write_records(ch, replace(events, "Sample", packed["event_id"], packed))
    result = by_key(run_audit(ch))["packing_preserves_weight"]
    assert len(result.failing_ids()) == 1 and "credit says 1" in result.failures[0].reason


def test_audit_cli_exit_codes_and_json(chdb_dsn: str, ch: Client, capsys: pytest.CaptureFixture[str]) -> None:
    events = events_of(clean_groups(1))
    write_records(ch, events)
    args = ["--dsn", chdb_dsn, "--database", ch.database]
    assert cli_main(["audit", *args]) == 0
    assert capsys.readouterr().out.count("PASS") == 5  # the four checks and feedback accounting
    score = next(r for n, r in events if n == "Score")
    write_records(ch, [("Score", {**score, "raw_json": "{}"})])
    assert cli_main(["audit", *args, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is False
    failing = [c for c in report["checks"] if not c["passed"]]
    assert [c["key"] for c in failing] == ["score_reviewability"]
    assert failing[0]["failures"][0]["id"] == score["event_id"]
    assert cli_main(["audit", *args, "--check", "nope"]) == 2


def test_trace_names_the_whole_chain(ch: Client, chdb_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    group = clean_groups(1)[0]
    packed = next(r for r in group.of("Sample") if r["kind"] == "PACKED")
    seg = [s for s in packed["segments"] if s["source"] == "OUTPUT"][1]
    _output_failed_to_parse(group, seg["call_id"])
    write_records(ch, group.events)
    position = seg["sample_start"] + 2
    trace = trace_sample(ch, packed["event_id"], position)
    token = trace["token"]
    assert token["in_loss"] and token["matches_call"] and token["segment"]["call_id"] == seg["call_id"]
    call = trace["calls"][0]
    assert call["call_id"] == seg["call_id"] and call["prompt_verified"]
    assert token["conditioning_prefix_len"] == call["prompt_length"] + 2
    assert call["prompt_delta_chain"] == [group.call_ids[0]]  # call #1 is a delta on call #0
    assert trace["trainer_steps"][0]["step"] == 0
    assert trace["rollouts"][0]["groups"][0]["group_id"] == group.group_id
    assert [s["rollout_id"] for s in trace["scores"]] == [seg["rollout_id"]]
    assert trace["rewards"][0]["score_ids"] == [trace["scores"][0]["event_id"]]
    assert trace["credits"][0]["reward_id"] == trace["rewards"][0]["event_id"]
    assert call["parse_errors"] == 2 and trace["rollouts"][0]["attempts"][0]["parse_failed_calls"] == 1
    text = format_trace(trace)
    for word in ("trained in", "token", "call", "prompt", "rollout", "group", "score", "reward", "credit"):
        assert f"\n  {word}" in text
    assert "\n  PARSE FAILED 2 parser error(s)" in text and ", 1 call(s) failed to parse" in text
    with pytest.raises(TraceError, match="no sample"):
        trace_sample(ch, "nope")
    args = ["--dsn", chdb_dsn, "--database", ch.database]
    assert cli_main(["trace", *args, packed["event_id"]]) == 0
    assert f"sample {packed['event_id']}" in capsys.readouterr().out
    assert cli_main(["trace", *args, packed["event_id"], "999999"]) == 2
    assert "outside sample" in capsys.readouterr().err


def _output_failed_to_parse(group: GroupEvents, call_id: str) -> None:
    """The gateway could not parse this call's output (two parser errors), as its record and rollout say."""
    for name, record in group.events:
        if name == "CallRecord" and record["call_id"] == call_id:
            record["sampling"] = dict(record["sampling"], extra_json=json.dumps({"parse_errors": ["a", "b"]}))
        if name == "CompletedRollout":
            for c in record["calls"]:
                c["parse_failures"] = 2 if c["call_id"] == call_id else 0


def test_report_is_self_contained_html(ch: Client, chdb_dsn: str, tmp_path: Path) -> None:
    for g in clean_groups(3):
        write_records(ch, g.events)
    html = build_report(ch)
    assert html.startswith("<!doctype html>") and "Reward against policy version" in html
    assert html.count("data:image/png;base64,") >= 3
    assert 'src="http' not in html  # nothing external
    assert html.count('class="pass"') == 5
    out = tmp_path / "r.html"
    assert cli_main(["report", "--dsn", chdb_dsn, "--database", ch.database, "--out", str(out)]) == 0
    assert out.read_text().startswith("<!doctype html>")


def test_weights_stay_exact_in_float32() -> None:
    """The synthetic per-token weights sum to the credit's weight within the audit tolerance."""
    sample = next(r for r in clean_groups(1)[0].of("Sample") if r["kind"] == "CALL")
    weights = unpack_floats(sample["weights"])
    assert np.isclose(weights.sum(dtype=np.float64) * 3, 1.0, rtol=1e-6)


def test_rolling_reward_weights_versions_by_rollouts() -> None:
    rows = [(1, 0.0, 1), (2, 1.0, 3), (3, 0.5, 0), (4, 1.0, 1)]
    assert rolling_reward(rows, 2) == [0.0, 0.75, 1.0, 1.0]
    assert rolling_reward(rows, 10)[-1] == 0.8
