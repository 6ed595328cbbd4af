"""Forgetting in ClickHouse (sinks/forget.py, issue 31 item 2): a subject's content is blanked in every
content table (bodies, payloads, texts emptied; token arrays zero-filled to their length), its facts stay
(ids, lengths, hashes, logprobs, weights), and other subjects' rows are untouched."""

from __future__ import annotations

import hashlib

from clickhouse_connect.driver.client import Client

from sinks.forget import blank_expired, blank_subject, subject_row_counts
from sinks.store import load_records, write_records
from testkit.storage_records import GroupSpec, synthetic_group


def _of_subject(subject: str, index: int) -> list[tuple[str, dict]]:
    g = synthetic_group(GroupSpec(group_index=index, rollouts=2, turns=2, bodies="chat"))
    for _name, record in g.events:
        if "subject" in record:
            record["subject"] = subject
    return g.events


def test_blanking_a_subject_keeps_facts_and_other_subjects(ch: Client) -> None:
    write_records(ch, [*_of_subject("alice", 0), *_of_subject("bob", 1)])
    before = {c["call_id"]: c for c in load_records(ch, "calls")}
    counts = blank_subject(ch, "alice")
    assert counts["calls"] == 4 and counts["rollouts"] == 2 and counts["samples"] >= 1
    assert blank_subject(ch, "nobody") == dict.fromkeys(counts, 0)
    after = load_records(ch, "calls")
    for call in after:
        was = before[call["call_id"]]
        if call["subject"] == "alice":
            assert call["request_json"] == "" and call["response_json"] == ""
            assert set(call["output_ids"]) == {0} and len(call["output_ids"]) == len(was["output_ids"])
            assert call["output_logprobs"] == was["output_logprobs"]  # a fact, kept
            # A whole prompt of zeros of its length, hashed as stored (readers verify what they rebuild).
            assert call["prompt"]["length"] == was["prompt"]["length"] and call["prompt"]["base_call_id"] is None
            assert call["prompt"]["ids"] == bytes(4 * was["prompt"]["length"])
            assert call["prompt"]["sha256"] == hashlib.sha256(call["prompt"]["ids"]).hexdigest()
        else:
            assert call == was
    rows = ch.query("SELECT subject, task_input_json, e_payload_json, c_output_sha256 FROM rollouts FINAL").result_rows
    for subject, task_input, payloads, output_hashes in rows:
        assert (task_input == "" and set(payloads) == {""}) == (subject == "alice")
        assert len(output_hashes) == 2  # the hashes of what was there stay: the audit's facts
    samples = load_records(ch, "samples")
    assert {s["subject"] for s in samples} == {"alice", "bob"}
    for sample in samples:
        assert (set(sample["input_ids"]) == {0}) == (sample["subject"] == "alice")
    assert subject_row_counts(ch, "alice")["calls"] == 4  # the rows stay: only their content went


def test_retention_blanks_content_past_its_tenants_days(ch: Client) -> None:
    write_records(ch, [*_of_subject("t1/alice", 0), *_of_subject("t2/bob", 1)])  # written in 2023
    assert blank_expired(ch, None, {}) == 0  # no retention configured: nothing swept
    blank_expired(ch, None, {"t1": 30.0, "t9": 1.0})  # t2 has none, and there is no default
    calls = load_records(ch, "calls")
    assert {c["subject"] for c in calls if c["request_json"] == ""} == {"t1/alice"}
    blank_expired(ch, 36500.0, {"t1": 30.0})  # a hundred years for everyone else: bob's rows are younger
    assert {c["subject"] for c in load_records(ch, "calls") if c["request_json"] == ""} == {"t1/alice"}
    blank_expired(ch, 1.0, {})
    assert all(c["request_json"] == "" for c in load_records(ch, "calls"))
