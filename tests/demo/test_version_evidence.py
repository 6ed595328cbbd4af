"""The vLLM demo's per-call version check (``version_evidence``) on stored rows as the sink writes them:
a one-version call matches only when vLLM's report and the gate's lease name the version it recorded; a call
an update landed in, only when it records its first version and exactly vLLM's spans (``version_spans``)."""

from __future__ import annotations

import json

import pytest

from demo.vllm import version_evidence

pytestmark = pytest.mark.e2e


def extra(**details: object) -> str:
    return json.dumps({"stop_token_ids": [2], "engine_details": details})


def test_calls_are_checked_one_by_one_against_vllm_and_the_lease() -> None:
    rows = [
        ("OK", 0, extra(weight_versions="default:0-8", gate_version=0)),
        ("OK", 3, extra(weight_versions="3:0-5", gate_version=3)),
        ("OK", 3, extra(weight_versions="3:0-2,4:2-5", gate_version=3)),  # two versions, no spans recorded
        ("OK", 5, extra(weight_versions="5:0-4", gate_version=4)),  # the lease disagrees
        ("OK", 6, extra(weight_versions="7:0-4", gate_version=6)),  # vLLM disagrees
        ("OK", 6, extra(vllm_id="x")),  # no report from vLLM
        ("ERROR", -1, "{}"),
    ]
    evidence = version_evidence(rows)
    assert evidence["calls"] == 7
    assert evidence["failed_requests"] == 1
    assert evidence["calls_checked_against_vllm"] == 5
    assert evidence["calls_without_vllm_version"] == 1
    assert evidence["version_mismatches"] == 3
    assert evidence["calls_spanning_versions"] == 1
    assert evidence["versions_served_by_vllm"] == 5  # 0, 3, 4, 5, 7
    assert evidence["newest_version_served_by_vllm"] == 7
    assert len(evidence["first_mismatches"]) == 3  # type: ignore[arg-type]


def test_agreeing_calls_have_no_mismatch() -> None:
    rows = [("OK", v, extra(weight_versions=f"{v}:0-6", gate_version=v)) for v in (1, 1, 2)]
    evidence = version_evidence(rows)
    assert (evidence["version_mismatches"], evidence["versions_served_by_vllm"]) == (0, 2)


def test_a_call_an_update_landed_in_matches_only_with_vllms_spans_recorded() -> None:
    report = extra(weight_versions="3:0-2,4:2-5", gate_version=3)
    rows = [
        ("OK", 3, report, [(3, 0, 2), (4, 2, 5)]),  # the record says what vLLM says
        ("OK", 3, report, [(3, 0, 3), (4, 3, 5)]),  # the boundary is off by one
        ("OK", 4, report, [(3, 0, 2), (4, 2, 5)]),  # recorded the newer version, not the first
        # as ClickHouse (named tuples) and the Avro record give them: right
        ("OK", 3, report, [{"version": 3, "start": 0, "end": 2}, {"version": 4, "start": 2, "end": 5}]),
    ]
    evidence = version_evidence(rows)
    assert (evidence["calls_spanning_versions"], evidence["version_mismatches"]) == (4, 2)
