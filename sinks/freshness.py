"""Freshness in ClickHouse (issue 30): how long a finished trajectory took to become a sample, and how old
a sample was when the trainer used it, from the times the stored records carry.

Two clocks meet here. A record's own ``created_at_us`` is an event time derived from its inputs (a
rollout's is its latest input's time, the finish; a sample's is its group's closing time, the last
member's finish for a full group), so replays reproduce it. ``src_time_ms`` is the Kafka record
timestamp the sink read (migration 0017): when the stage produced the record, or when the broker
appended it on a LogAppendTime topic. Their difference is the stage's latency; across hosts it includes
their clock offset (keep the clocks synchronised, NTP or better). Rows stored before migration 0017
have no Kafka time (-1) and are left out of the latency view.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from clickhouse_connect.driver.client import Client

# Migration 0017: the Kafka record timestamp of every stored row, -1 where the record had none.
SRC_TIME_COLUMN = "src_time_ms Int64 DEFAULT -1 AFTER src_offset"

VIEWS: dict[str, str] = {
    # One row per (sample, rollout it holds): finish -> CompletedRollout on Kafka, the group's closing
    # (its last member's finish) -> Sample on Kafka, and the rollout's own finish -> Sample (which adds
    # the wait for its group's later members).
    "v_sample_latency": """
        SELECT s.time AS time, s.sample_id AS sample_id, r.rollout_id AS rollout_id,
               r.finished_us AS finished_at_us, s.ready_us AS group_ready_at_us,
               (r.on_kafka_ms * 1000 - r.finished_us) / 1000 AS finish_to_rollout_ms,
               (s.on_kafka_ms * 1000 - s.ready_us) / 1000 AS ready_to_sample_ms,
               (s.on_kafka_ms * 1000 - r.finished_us) / 1000 AS finish_to_sample_ms
        FROM (SELECT event_time AS time, event_id AS sample_id, created_at_us AS ready_us,
                     src_time_ms AS on_kafka_ms, rid
              FROM {db}.samples FINAL ARRAY JOIN rollout_ids AS rid WHERE src_time_ms >= 0) AS s
        INNER JOIN (SELECT rollout_id, created_at_us AS finished_us, src_time_ms AS on_kafka_ms
                    FROM {db}.rollouts FINAL WHERE status = 'COMPLETE' AND counted AND src_time_ms >= 0) AS r
            ON s.rid = r.rollout_id""",
    # One row per sample a training step used: its age in policy versions (as v_staleness) and in
    # seconds, from its group's closing to the step.
    "v_sample_age": """
        SELECT t.time AS time, t.run_id AS run_id, t.step AS step, t.sample_id AS sample_id,
               t.trainer_version AS trainer_version, s.version_first AS sample_version_first,
               t.trainer_version - s.version_first AS age_versions,
               (t.step_us - s.ready_us) / 1e6 AS age_s
        FROM (SELECT event_time AS time, run_id, step, policy_version_before AS trainer_version,
                     created_at_us AS step_us, sample_id
              FROM {db}.trainer_steps FINAL ARRAY JOIN sample_ids AS sample_id) AS t
        INNER JOIN (SELECT event_id AS sample_id, policy_version_first AS version_first, created_at_us AS ready_us
                    FROM {db}.samples FINAL) AS s
            ON t.sample_id = s.sample_id""",
}

LATENCY_SQL = """SELECT count(), quantile(0.5)(ready_to_sample_ms), quantile(0.99)(ready_to_sample_ms),
       max(ready_to_sample_ms), quantile(0.99)(finish_to_sample_ms)
FROM v_sample_latency"""
AGE_SQL = """SELECT count(), quantile(0.5)(age_s), quantile(0.99)(age_s), max(age_s), avg(age_versions),
       max(age_versions)
FROM v_sample_age"""

TableFn = Callable[[Sequence[str], Sequence[Sequence[Any]]], str]


def freshness_section(client: Client, table: TableFn) -> str:
    """The report's freshness tables: trajectory -> sample latency, sample age at training."""
    latency = client.query(LATENCY_SQL).result_rows[0]
    age = client.query(AGE_SQL).result_rows[0]
    return (
        "<p>Group closed (its last rollout finished) to the sample on Kafka, and a rollout's own finish to it "
        "(from the Kafka record times the sink stored).</p>"
        + table(["samples x rollouts", "p50 ms", "p99 ms", "max ms", "own finish p99 ms"], [latency])
        + "<p>Sample age when a training step used it: seconds from its group's closing, policy versions.</p>"
        + table(["samples trained", "p50 s", "p99 s", "max s", "mean versions", "max versions"], [age])
    )
