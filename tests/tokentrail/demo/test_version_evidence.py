"""The vLLM demo's per-call version check (``version_evidence``) on stored rows as the sink writes them:
a call matches only when every span vLLM reported and the gate's lease name the version it recorded."""

from __future__ import annotations

import json

from tokentrail.demo.vllm import version_evidence


def extra(**details: object) -> str:
    return json.dumps({"stop_token_ids": [2], "engine_details": details})


def test_calls_are_checked_one_by_one_against_vllm_and_the_lease() -> None:
    rows = [
        ("OK", 0, extra(weight_versions="default:0-8", gate_version=0)),
        ("OK", 3, extra(weight_versions="3:0-5", gate_version=3)),
        ("OK", 3, extra(weight_versions="3:0-2,4:2-5", gate_version=3)),  # spans two versions: a mismatch
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
