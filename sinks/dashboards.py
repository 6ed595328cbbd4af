"""The Grafana dashboard (grafana-clickhouse-datasource), generated from one list of panels.

``python -m sinks.dashboards`` rewrites deploy/grafana/tokentrail-dashboard.json; a test checks the
committed file matches and that every panel's SQL runs on chDB (macros expanded).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD_PATH = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "tokentrail-dashboard.json"
DATASOURCE = {"type": "grafana-clickhouse-datasource", "uid": "${datasource}"}
FORMAT_TIMESERIES, FORMAT_TABLE = 0, 1


@dataclass(frozen=True)
class Panel:
    title: str
    sql: str
    kind: str = "timeseries"  # timeseries | table | barchart | stat
    width: int = 12
    height: int = 8
    description: str = ""


PANELS: tuple[Panel, ...] = (
    Panel(
        "Mean reward by policy version",
        "SELECT toString(policy_version) AS policy_version, avg(raw_reward) AS mean_raw_reward,\n"
        "       avg(reward) AS mean_reward, count() AS rollouts\n"
        "FROM v_reward_by_policy WHERE $__timeFilter(time) AND NOT filtered\n"
        "GROUP BY policy_version ORDER BY toInt64(policy_version)",
        kind="barchart",
        description="Raw (pre-normalisation) and final reward of counted, complete rollouts.",
    ),
    Panel(
        "Raw reward over time, per policy version",
        "SELECT $__timeInterval(time) AS time, concat('v', toString(policy_version)) AS version,\n"
        "       avg(raw_reward) AS raw_reward\n"
        "FROM v_reward_by_policy WHERE $__timeFilter(time) AND NOT filtered\n"
        "GROUP BY time, version ORDER BY time",
    ),
    Panel(
        "Groups closed (full / partial / late)",
        "SELECT $__timeInterval(time) AS time, countIf(status = 'FULL') AS full,\n"
        "       countIf(status = 'PARTIAL') AS partial, countIf(status = 'LATE') AS late\n"
        "FROM v_group_completion WHERE $__timeFilter(time) GROUP BY time ORDER BY time",
    ),
    Panel(
        "Partial and late groups",
        "SELECT time, group_id, status, size, expected_size, round(fill, 3) AS fill\n"
        "FROM v_group_completion WHERE status != 'FULL' AND $__timeFilter(time)\n"
        "ORDER BY time DESC LIMIT 200",
        kind="table",
    ),
    Panel(
        "Incomplete rollouts",
        "SELECT $__timeInterval(time) AS time, count() AS incomplete\n"
        "FROM v_incomplete_rollouts WHERE $__timeFilter(time) GROUP BY time ORDER BY time",
    ),
    Panel(
        "Incomplete rollouts: what is missing",
        "SELECT time, rollout_id, attempt_id, arrayStringConcat(missing, '; ') AS missing,\n"
        "       finish_status, calls\n"
        "FROM v_incomplete_rollouts WHERE $__timeFilter(time) ORDER BY time DESC LIMIT 200",
        kind="table",
    ),
    Panel(
        "Prefix-merge rate (token-level prefix between adjacent calls)",
        "SELECT $__timeInterval(time) AS time, avg(is_prefix) AS prefix_rate, count() AS call_pairs\n"
        "FROM v_prefix_links WHERE $__timeFilter(time) GROUP BY time ORDER BY time",
        description="Share of adjacent call pairs whose prompt_i || output_i is a token prefix of prompt_i+1.",
    ),
    Panel(
        "Staleness at training (policy versions behind)",
        "SELECT $__timeInterval(time) AS time, avg(staleness) AS mean_staleness,\n"
        "       max(staleness) AS max_staleness\n"
        "FROM v_staleness WHERE $__timeFilter(time) GROUP BY time ORDER BY time",
    ),
    # ---- issue 30: freshness, from the records' event times and the Kafka times the sink stored
    Panel(
        "Freshness: finished trajectory -> sample on Kafka (ms)",
        "SELECT $__timeInterval(time) AS time, quantile(0.5)(ready_to_sample_ms) AS p50_ms,\n"
        "       quantile(0.99)(ready_to_sample_ms) AS p99_ms, max(ready_to_sample_ms) AS max_ms,\n"
        "       quantile(0.99)(finish_to_sample_ms) AS own_finish_p99_ms\n"
        "FROM v_sample_latency WHERE $__timeFilter(time) GROUP BY time ORDER BY time",
        description="From a group's last rollout finishing to its samples on tokentrail.samples (own finish: from "
        "each rollout's finish, so it adds the wait for its group's later members). v_sample_latency.",
    ),
    Panel(
        "Freshness: sample age at training (seconds, policy versions)",
        "SELECT $__timeInterval(time) AS time, quantile(0.5)(age_s) AS p50_s, quantile(0.99)(age_s) AS p99_s,\n"
        "       avg(age_versions) AS mean_versions, max(age_versions) AS max_versions\n"
        "FROM v_sample_age WHERE $__timeFilter(time) GROUP BY time ORDER BY time",
        description="When a training step used a sample: seconds since its group closed, versions behind "
        "(v_sample_age).",
    ),
    Panel(
        "Tokens per second",
        "SELECT $__timeInterval(time) AS time, sum(output_tokens) / $__interval_s AS sampled_tokens_per_s,\n"
        "       sum(prompt_length) / $__interval_s AS prompt_tokens_per_s\n"
        "FROM v_call_tokens WHERE $__timeFilter(time) GROUP BY time ORDER BY time",
    ),
    Panel(
        "Dead letters by reason",
        "SELECT source_topic, error_type, count() AS messages, any(reason) AS example_reason\n"
        "FROM dead_letters FINAL WHERE $__timeFilter(event_time)\n"
        "GROUP BY source_topic, error_type ORDER BY messages DESC",
        kind="table",
    ),
    # ---- issue 19: off-policy truth (engine/trainer logprob mismatch, TIS/MIS) and bounded staleness
    Panel(
        "Engine/trainer logprob mismatch per step",
        "SELECT $__timeInterval(event_time) AS time,\n"
        "       sum(mismatch_mean_abs * mismatch_tokens) / sum(mismatch_tokens) AS mean_abs_delta,\n"
        "       max(mismatch_max_abs) AS max_abs_delta,\n"
        "       sum(mismatch_beyond_fraction * mismatch_tokens) / sum(mismatch_tokens) AS beyond_bound_fraction\n"
        "FROM trainer_steps FINAL WHERE $__timeFilter(event_time) AND mismatch_tokens > 0\n"
        "GROUP BY time ORDER BY time",
        description="|log p_trainer - log p_engine| of sampled tokens under the version that sampled them "
        "(trainer.mismatch_bound sets the bound).",
    ),
    Panel(
        "Importance sampling (TIS / MIS): share of tokens truncated or masked",
        "SELECT $__timeInterval(event_time) AS time, importance_sampling,\n"
        "       sum(importance_truncated) / greatest(sum(importance_tokens), 1) AS truncated_fraction\n"
        "FROM trainer_steps FINAL WHERE $__timeFilter(event_time) AND importance_tokens > 0\n"
        "GROUP BY time, importance_sampling ORDER BY time",
    ),
    Panel(
        "Stale samples dropped and tokens masked (staleness bound)",
        "SELECT $__timeInterval(event_time) AS time, sum(length(stale_dropped_ids)) AS stale_samples_dropped,\n"
        "       sum(stale_masked_tokens) AS stale_tokens_masked\n"
        "FROM trainer_steps FINAL WHERE $__timeFilter(event_time) GROUP BY time ORDER BY time",
        description="trainer.max_staleness and trainer.stale_rule; each dropped sample is in v_stale_dropped.",
    ),
    # ---- end issue 19
    # ---- issue 21: production feedback (coverage, delay per kind, late and unmatched, reward by version)
    Panel(
        "Feedback coverage: rollouts and organic sessions with feedback",
        "SELECT $__timeInterval(event_time) AS time, avg(NOT filtered) AS rollouts_with_feedback,\n"
        "       avgIf(NOT filtered, startsWith(rollout_id, 'session-')) AS sessions_with_feedback,\n"
        "       countIf(startsWith(rollout_id, 'session-')) AS sessions\n"
        "FROM rewards FINAL WHERE $__timeFilter(event_time)\n"
        "  AND JSONExtractString(components_json, 'source') = 'feedback'\n"
        "  AND NOT JSONExtractBool(components_json, 'replay')\n"
        "GROUP BY time ORDER BY time",
        description="Share of the feedback join's rewards (one per completed rollout, at its window's end) that "
        "have a value; the rest are filtered for want of feedback. Sessions: organic session windows.",
    ),
    Panel(
        "Feedback delay per kind (s after the response it names)",
        "SELECT f.kind AS kind, count() AS feedback,\n"
        "       round(quantile(0.1)((f.event_time_us - c.received_at_us) / 1e6), 1) AS p10_s,\n"
        "       round(quantile(0.5)((f.event_time_us - c.received_at_us) / 1e6), 1) AS p50_s,\n"
        "       round(quantile(0.9)((f.event_time_us - c.received_at_us) / 1e6), 1) AS p90_s,\n"
        "       round(max((f.event_time_us - c.received_at_us) / 1e6), 1) AS max_s,\n"
        "       round(quantile(0.5)((f.created_at_us - f.event_time_us) / 1e6), 1) AS p50_arrival_lag_s\n"
        "FROM (SELECT kind, call_id, event_time_us, created_at_us FROM feedback FINAL\n"
        "      WHERE $__timeFilter(event_time) AND call_id IS NOT NULL) AS f\n"
        "INNER JOIN (SELECT call_id, received_at_us FROM calls FINAL) AS c ON f.call_id = c.call_id\n"
        "GROUP BY kind ORDER BY kind",
        kind="table",
        description="Event time of feedback naming a response or call, after that call reached the gateway; "
        "the report gives the delay after the rollout's close.",
    ),
    Panel(
        "Late, unmatched and invalid feedback",
        "SELECT $__timeInterval(event_time) AS time, countIf(stage = 'feedback_late') AS late,\n"
        "       countIf(stage = 'feedback_join') AS unmatched, countIf(stage = 'feedback_router') AS invalid\n"
        "FROM dead_letters FINAL WHERE $__timeFilter(event_time)\n"
        "  AND stage IN ('feedback_late', 'feedback_join', 'feedback_router')\n"
        "GROUP BY time ORDER BY time",
        description="Dead letters of the feedback join: late (after its window; replay --feedback uses it), "
        "unmatched (named no known rollout within match_wait_s), invalid.",
    ),
    Panel(
        "Reward from feedback alone, by policy version",
        "SELECT toString(policy_version) AS policy_version, avg(reward) AS mean_feedback_reward,\n"
        "       count() AS rollouts\n"
        "FROM v_reward_by_policy WHERE $__timeFilter(time) AND NOT filtered\n"
        "  AND reward_config_id IN (SELECT DISTINCT reward_config_id FROM rewards\n"
        "                           WHERE JSONExtractString(components_json, 'source') = 'feedback')\n"
        "GROUP BY policy_version ORDER BY toInt64(policy_version)",
        kind="barchart",
        description="The feedback join's rewards (no verifier) of completed rollouts, by the newest policy "
        "version that sampled them.",
    ),
    # ---- end issue 21
    # ---- issue 22: safe policy release (versions in traffic, reward per version, decisions)
    Panel(
        "Release: share of calls by policy version",
        "SELECT time, version, calls / sum(calls) OVER (PARTITION BY time) AS share\n"
        "FROM (SELECT $__timeInterval(event_time) AS time, concat('v', toString(policy_version)) AS version,\n"
        "             count() AS calls\n"
        "      FROM calls FINAL WHERE $__timeFilter(event_time) AND NOT scripted\n"
        "        AND ifNull(release_arm, '') != 'pinned' GROUP BY time, version)\n"
        "ORDER BY time, version",
        description="Which versions produced the calls' tokens: a candidate's share ramps up, goes to 1 on a "
        "promotion and to 0 on a rollback. Pinned (evaluation) calls are left out (their own panel). The "
        "decisions are in the table beside it.",
    ),
    Panel(
        "Release decisions",
        "SELECT fromUnixTimestamp64Micro(created_at_us) AS time, model, sequence, action, source, rule,\n"
        "       serving_version AS serving, candidate_version AS candidate, candidate_fraction AS share_after,\n"
        "       round(interval_low, 4) AS interval_low, round(interval_high, 4) AS interval_high,\n"
        "       serving_rewards, candidate_rewards, reason\n"
        "FROM release_decisions FINAL ORDER BY model, sequence DESC LIMIT 200",
        kind="table",
        description="Every ReleaseDecision (controller and operators), with the always-valid interval of "
        "candidate minus serving mean reward it was taken on (docs/release.md).",
    ),
    Panel(
        "Release: raw reward per version (95% interval)",
        "SELECT toString(r.version) AS policy_version, avg(w.raw_reward) AS mean_raw_reward,\n"
        "       mean_raw_reward - 1.96 * sqrt(varSamp(w.raw_reward) / count()) AS low,\n"
        "       mean_raw_reward + 1.96 * sqrt(varSamp(w.raw_reward) / count()) AS high, count() AS rollouts\n"
        "FROM rewards AS w FINAL\n"
        "INNER JOIN (SELECT rollout_id, arrayMax(policy_versions) AS version FROM rollouts FINAL\n"
        "            WHERE status = 'COMPLETE' AND notEmpty(policy_versions)\n"
        "              AND arrayMin(policy_versions) = arrayMax(policy_versions)) AS r ON w.rollout_id = r.rollout_id\n"
        "WHERE $__timeFilter(event_time) AND NOT (w.filtered AND startsWith(ifNull(w.filter_reason, ''), "
        "'score_error'))\n"
        "  AND JSONExtractString(w.components_json, 'source') != 'feedback'\n"
        "  AND w.rollout_id NOT IN (SELECT rollout_id FROM calls FINAL WHERE release_arm = 'pinned')\n"
        "GROUP BY r.version ORDER BY r.version",
        kind="table",
        description="What the release controller compares: verifier raw reward of rollouts served by one "
        "version (a normal 95% interval per version; the controller's own test is always-valid).",
    ),
    Panel(
        "Trainer resumes after a release rollback",
        "SELECT fromUnixTimestamp64Micro(created_at_us) AS time, run_id,\n"
        "       concat('v', toString(policy_version_before)) AS weights_before,\n"
        "       concat('v', toString(resumed_from_version)) AS resumed_from,\n"
        "       concat('v', toString(policy_version_after)) AS published_as,\n"
        "       concat('v', toString(rolled_back_version)) AS rolled_back, resume_decision_id, resume_reason\n"
        "FROM trainer_steps FINAL WHERE $__timeFilter(event_time) AND resumed_from_version >= 0\n"
        "ORDER BY time DESC LIMIT 200",
        kind="table",
        width=24,
        description="TrainerStep v3 resume events: after a rollback of a candidate its weights descend from, the "
        "trainer loads the version the rollback kept serving and publishes it again as its next version.",
    ),
    Panel(
        "Release: pinned (evaluation) traffic per pin",
        "SELECT model, ifNull(release_pin_label, '') AS pin_label, concat('v', toString(policy_version)) AS version,\n"
        "       count() AS calls, uniqExact(rollout_id) AS rollouts, countIf(status != 'OK') AS errors\n"
        "FROM calls FINAL WHERE $__timeFilter(event_time) AND release_arm = 'pinned'\n"
        "GROUP BY model, pin_label, version ORDER BY model, pin_label, version",
        kind="table",
        description="Calls the release routed by a pinned traffic label (CallRecord.release): served the pinned "
        "version whatever the ramp, and kept out of the candidate/serving comparison.",
    ),
    # ---- end issue 22
    # ---- issue 28: chat-template drift per harness, family and renderer version (sinks/drift_views.py)
    Panel(
        "Template drift: calls, spliced calls, breaks and parse failures per harness and family",
        "SELECT harness, family, parser_version, sum(calls) AS calls, sum(spliced_calls) AS spliced,\n"
        "       sum(calls_with_breaks) AS calls_with_breaks, sum(parse_failures) AS parse_failures\n"
        "FROM v_family_drift WHERE $__timeFilter(time)\n"
        "GROUP BY harness, family, parser_version ORDER BY harness, family, parser_version",
        kind="table",
        width=24,
        description="Per (harness, family, renderer version): how many calls kept every earlier sampled token "
        "(spliced), how many prompts broke the prefix, and how many outputs' tool-call markup did not parse.",
    ),
    Panel(
        "Template drift: prefix breaks by cause",
        "SELECT $__timeInterval(time) AS time, concat(family, ' / ', harness, ': ', cause) AS series,\n"
        "       count() AS breaks\n"
        "FROM v_prefix_break_causes WHERE $__timeFilter(time) GROUP BY time, series ORDER BY time",
        description="Named causes (reasoning dropped, tool arguments re-serialized, compaction, ...) of the "
        "prefix breaks the gateway recorded, per family and harness.",
    ),
    Panel(
        "Template drift: outputs that did not parse",
        "SELECT time, harness, family, parser_version, call_id, parse_error_texts\n"
        "FROM v_call_conformance WHERE $__timeFilter(time) AND parse_errors > 0\n"
        "ORDER BY time DESC LIMIT 200",
        kind="table",
        width=24,
        description="Calls whose tool-call markup the family's parser could not parse (answered as content, as "
        "the family's reference server answers it), with the parser's errors.",
    ),
)


def expand_macros(sql: str, interval_s: int = 60) -> str:
    """Grafana's ClickHouse macros replaced by plain SQL (for tests and the HTML report)."""
    sql = re.sub(r"\$__timeFilter\((\w+)\)", "1", sql)
    sql = re.sub(r"\$__timeInterval\((\w+)\)", rf"toStartOfInterval(\1, INTERVAL {interval_s} SECOND)", sql)
    return sql.replace("$__interval_s", str(interval_s))


def _panel_json(i: int, panel: Panel, x: int, y: int) -> dict[str, Any]:
    table_like = panel.kind in ("table", "barchart", "stat")
    target = {
        "datasource": DATASOURCE,
        "editorType": "sql",
        "format": FORMAT_TABLE if table_like else FORMAT_TIMESERIES,
        "queryType": "table" if table_like else "timeseries",
        "rawSql": panel.sql,
        "refId": "A",
    }
    return {
        "id": i + 1,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "targets": [target],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {},
    }


def dashboard(database: str = "tokentrail") -> dict[str, Any]:
    panels, x, y = [], 0, 0
    for i, panel in enumerate(PANELS):
        if x + panel.width > 24:
            x, y = 0, y + panel.height
        panels.append(_panel_json(i, panel, x, y))
        x += panel.width
    return {
        "__requires": [
            {
                "type": "datasource",
                "id": "grafana-clickhouse-datasource",
                "name": "ClickHouse",
                "version": "4.0.0",
            }
        ],
        "title": "tokentrail",
        "uid": "tokentrail-main",
        "tags": ["tokentrail", "rl"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "description": f"tokentrail event store (database {database}): rewards, groups, rollouts, prefix "
        "merges, staleness, throughput. Views are created by `tokentrail clickhouse migrate`.",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "ClickHouse",
                    "type": "datasource",
                    "query": "grafana-clickhouse-datasource",
                    "current": {},
                    "hide": 0,
                }
            ]
        },
        "panels": panels,
    }


def write_dashboard(path: Path = DASHBOARD_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dashboard(), indent=2) + "\n")
    return path


if __name__ == "__main__":
    print(write_dashboard())
