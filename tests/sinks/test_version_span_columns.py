"""Migration 0014 in chDB: per-token version spans (calls, rollouts' calls, samples) and the release arm of a
call are stored, read back into the same records, and answer SQL (which calls spanned an update, how many loss
tokens a version sampled). Rows stored before 0014 read as the Avro defaults: test_store.py's migration test."""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from sinks.store import load_records, load_rollouts, write_records
from testkit.storage_records import GroupSpec, synthetic_group


def test_version_spans_and_release_round_trip_and_answer_sql(ch: Client) -> None:
    g = synthetic_group(GroupSpec(rollouts=2, turns=2, policy_version=3, trainer_step=False))
    call = g.of("CallRecord")[1]  # rollout 0's second call: a weight update landed after 10 of its tokens
    n = len(call["output_ids"]) // 4
    spans = [{"version": 3, "start": 0, "end": 10}, {"version": 4, "start": 10, "end": n}]
    call.update(version_spans=spans, release={"release_id": "rel-1", "decision_sequence": 4, "arm": "candidate",
                                              "pin_label": None})
    rollout = next(r for r in g.of("CompletedRollout") if r["rollout_id"] == call["rollout_id"])
    next(c for c in rollout["calls"] if c["call_id"] == call["call_id"])["version_spans"] = spans
    rollout["policy_versions"] = [3, 4]
    spanned = [s for s in g.of("Sample") if any(seg["call_id"] == call["call_id"] and seg["source"] == "OUTPUT"
                                                for seg in s["segments"])]
    assert spanned
    for sample in spanned:
        at = next(seg["sample_start"] for seg in sample["segments"] if seg["call_id"] == call["call_id"]
                  and seg["source"] == "OUTPUT")
        sample.update(policy_version_last=4, version_spans=[{"version": 3, "start": at, "end": at + 10},
                                                            {"version": 4, "start": at + 10, "end": at + n}])
    write_records(ch, g.events)

    def by_id(records: list[dict]) -> list[dict]:
        return sorted(records, key=lambda r: r["event_id"])

    assert by_id(load_records(ch, "calls")) == by_id(g.of("CallRecord"))
    assert by_id(load_rollouts(ch)) == by_id(g.of("CompletedRollout"))
    assert by_id(load_records(ch, "samples")) == by_id(g.of("Sample"))
    rows = ch.query("SELECT call_id, release_arm, arrayMap(s -> s.version, version_spans) FROM calls FINAL "
                    "WHERE notEmpty(version_spans) OR release_id IS NOT NULL").result_rows
    assert rows == [(call["call_id"], "candidate", [3, 4])]
    # Loss tokens sampled by version 3 in samples that carry spans: what trainer.stale_rule=mask would take.
    stale = ch.query("SELECT sum(arraySum(arrayMap(s -> s.end - s.start, arrayFilter(s -> s.version < 4, "
                     "version_spans)))) FROM samples FINAL").result_rows[0][0]
    assert stale == 10 * len(spanned)
