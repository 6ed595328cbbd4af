"""Freshness on chDB (issue 30): the Kafka time the sink keeps on every row (migration 0017), the views
v_sample_latency and v_sample_age, their dashboard panels and the report's section, over a group the
real processors core derived."""

from __future__ import annotations

from collections import Counter
from typing import Any

from clickhouse_connect.driver.client import Client

from sinks import dashboards
from sinks.report import build_report
from sinks.rows import Source
from sinks.sample_refs import SampleRefs
from sinks.store import group_rows, insert_grouped, write_records
from trainer_consumer.batching import Batch
from trainer_consumer.events import trainer_step_record

from .pipeline_data import pipeline_events, sample_config

ROLLOUT_DELAY_MS = 40  # each rollout on Kafka this long after its finish
SAMPLE_DELAY_MS = 150  # each sample on Kafka this long after its group closed


def _rows(ch: Client, sql: str) -> list[dict[str, Any]]:
    result = ch.query(sql)
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def _store(ch: Client) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The pipeline's events, rollouts and samples with Kafka times as the sink reads them."""
    events, group, members = pipeline_events(7, sample_config(merge=False, pack=False))
    timed = [(n, r) for n, r in events if n in ("CompletedRollout", "Sample")]
    write_records(ch, [(n, r) for n, r in events if n not in ("CompletedRollout", "Sample")])
    samples = [r for n, r in timed if n == "Sample"]
    for offset, (name, record) in enumerate(timed):
        delay = ROLLOUT_DELAY_MS if name == "CompletedRollout" else SAMPLE_DELAY_MS
        source = Source("tokentrail.x", 0, offset, record["created_at_us"] // 1000 + delay)
        insert_grouped(ch, group_rows([(name, record)], source), SampleRefs())
    return group, members, samples


def test_the_sink_keeps_the_kafka_time_and_the_views_time_each_stage(ch: Client) -> None:
    group, members, samples = _store(ch)
    stored = _rows(ch, "SELECT src_time_ms, created_at_us FROM rollouts FINAL")
    assert sorted(r["src_time_ms"] - r["created_at_us"] // 1000 for r in stored) == [ROLLOUT_DELAY_MS] * 4
    assert _rows(ch, "SELECT min(src_time_ms) AS t FROM calls FINAL")[0]["t"] == -1  # stored without a Kafka time

    latency = _rows(ch, "SELECT * FROM v_sample_latency ORDER BY rollout_id, sample_id")
    assert len(latency) == len(samples) and {r["rollout_id"] for r in latency} == {m["rollout_id"] for m in members}
    ready_us = int(group["created_at_us"])  # a full group closes at its last member's finish
    for row in latency:
        finish_us = next(int(m["created_at_us"]) for m in members if m["rollout_id"] == row["rollout_id"])
        assert row["group_ready_at_us"] == ready_us and row["finished_at_us"] == finish_us
        assert row["finish_to_rollout_ms"] == ROLLOUT_DELAY_MS
        assert row["ready_to_sample_ms"] == SAMPLE_DELAY_MS
        assert row["finish_to_sample_ms"] == SAMPLE_DELAY_MS + (ready_us - finish_us) / 1000
    # The members finished 1 ms apart: the first one's samples also waited 3 ms for the last member.
    assert max(r["finish_to_sample_ms"] for r in latency) == SAMPLE_DELAY_MS + 3

    (panel,) = _rows(ch, dashboards.expand_macros(next(
        p for p in dashboards.PANELS if p.title.startswith("Freshness: finished trajectory")).sql, interval_s=10**9))
    assert panel["p50_ms"] == panel["p99_ms"] == panel["max_ms"] == SAMPLE_DELAY_MS


def test_sample_age_at_training_in_seconds_and_versions(ch: Client) -> None:
    group, _members, samples = _store(ch)
    trained = sorted(s["event_id"] for s in samples)[:3]
    step = trainer_step_record("run-f", 1, 5, 6, Batch([], Counter(), []), None,
                               created_at_us=int(group["created_at_us"]) + 2_500_000)
    write_records(ch, [("TrainerStep", {**step, "sample_ids": trained})])

    ages = _rows(ch, "SELECT * FROM v_sample_age ORDER BY sample_id")
    assert [a["sample_id"] for a in ages] == trained
    assert all(a["age_s"] == 2.5 and a["age_versions"] == 5 - a["sample_version_first"] for a in ages)
    assert {a["age_versions"] for a in ages} == {5}  # the core's samples come from policy version 0

    (panel,) = _rows(ch, dashboards.expand_macros(next(
        p for p in dashboards.PANELS if p.title.startswith("Freshness: sample age")).sql, interval_s=10**9))
    assert (panel["p50_s"], panel["p99_s"], panel["max_versions"]) == (2.5, 2.5, 5)
    html = build_report(ch, audit=False)
    assert "Freshness" in html and "samples trained" in html
