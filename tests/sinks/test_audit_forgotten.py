"""After a forget (issue 31 items 3-4): the audit reports the forgotten subject's events as "forgotten by
request <id>", not as failures, and the counts add up; replay skips the groups it cannot re-derive and says
how many rollouts; `tokentrail trace` on a forgotten sample says so. Other subjects are unaffected."""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from processors.pipeline import StageConfigs
from schemas.forget_events import forgotten_event
from sinks.audit import format_table, run_audit
from sinks.forget import blank_subject, versions_trained_on
from sinks.replay import replay
from sinks.store import write_records
from sinks.trace import format_trace, trace_sample
from testkit.storage_records import GroupSpec, synthetic_group

CONFIGS = StageConfigs.load("deploy/config/reward.yaml", "deploy/config/credit.yaml", "deploy/config/sample.yaml")


def _group(subject: str, index: int) -> list[tuple[str, dict]]:
    g = synthetic_group(GroupSpec(group_index=index, policy_version=index + 1, pack=True))
    for _name, record in g.events:
        if "subject" in record:
            record["subject"] = subject
    return g.events


def test_audit_replay_and_trace_after_a_forget(ch: Client) -> None:
    alice, bob = _group("alice", 0), _group("bob", 1)
    write_records(ch, [*alice, *bob])
    before = {r.key: r for r in run_audit(ch)}
    assert all(r.passed for r in before.values())
    event = forgotten_event(request_id="forget-req-1", subject="alice", requested_by="dpo", reason="erasure",
                            key_ids=["alice#1"], requested_at_us=1, created_at_us=2)
    write_records(ch, [("Forgotten", event)])
    assert versions_trained_on(ch, "alice") == [2] and versions_trained_on(ch, "bob") == [3]
    blank_subject(ch, "alice")
    assert versions_trained_on(ch, "alice") == [2]  # lineage survives the forget: a query, as promised

    results = {r.key: r for r in run_audit(ch)}
    assert all(r.passed for r in results.values()), {k: r.failures[:3] for k, r in results.items()}
    tokens = results["token_traceability"]
    alice_samples = {r["event_id"] for n, r in alice if n == "Sample"}
    assert {f["id"] for f in tokens.forgotten} == alice_samples
    assert {f["request_id"] for f in tokens.forgotten} == {"forget-req-1"}
    assert tokens.checked == before["token_traceability"].checked  # the counts add up: nothing vanished
    assert any(f"{len(alice_samples)} Sample forgotten by request forget-req-1" in n for n in tokens.notes)
    assert "forgotten by request forget-req-1" in format_table(list(results.values()))
    alice_rollouts = {r["event_id"] for n, r in alice if n == "CompletedRollout"}
    assert {f["id"] for f in results["rollout_traceability"].forgotten} == alice_rollouts

    result = replay(ch, CONFIGS)
    assert set(result.forgotten_rollouts) == alice_rollouts
    assert result.groups == 1  # bob's group re-derived
    assert [reason for _, reason in result.skipped] == ["content forgotten by request forget-req-1"]

    sample_id = sorted(alice_samples)[0]
    trace = trace_sample(ch, sample_id)
    assert trace["sample"]["forgotten_by_request"] == "forget-req-1"
    assert "FORGOTTEN" in format_trace(trace)
    bob_sample = next(r["event_id"] for n, r in bob if n == "Sample")
    assert trace_sample(ch, bob_sample)["sample"]["forgotten_by_request"] is None
