"""Helper views over the tables (created or replaced on every migrate run)."""

from __future__ import annotations

from sinks.ddl.drift_views import DRIFT_VIEWS
from sinks.freshness import VIEWS as FRESHNESS_VIEWS

# Helper views. Every view reads FINAL, so a person or a dashboard never sees a duplicate.
VIEWS: dict[str, str] = {
    # All environment evidence of an attempt, whatever its kind.
    "env_events": """
        SELECT event_id, rollout_id, attempt_id, 'AttemptStarted' AS event_type, created_at_us
        FROM {db}.attempt_starts FINAL
        UNION ALL
        SELECT event_id, rollout_id, attempt_id, 'EnvStep' AS event_type, created_at_us
        FROM {db}.env_steps FINAL
        UNION ALL
        SELECT event_id, rollout_id, attempt_id, 'AttemptFinished' AS event_type, created_at_us
        FROM {db}.attempt_finishes FINAL""",
    # One row per sample segment: which call, which offsets. input_ids is empty where the sample's ids
    # are stored by reference to its calls (migration 0006; sinks.store rebuilds them).
    "sample_segments": """
        SELECT event_id AS sample_id, sample_config_id, kind AS sample_kind, seg_rollout_id AS rollout_id,
               seg_call_id AS call_id, seg_call_index AS call_index, seg_source AS source,
               seg_sample_start AS sample_start, seg_call_start AS call_start, seg_length AS length,
               input_ids, loss_mask, weights
        FROM {db}.samples FINAL
        ARRAY JOIN seg_rollout_id, seg_call_id, seg_call_index, seg_source, seg_sample_start,
                   seg_call_start, seg_length""",
    # The rollout each reward belongs to, with the newest policy version that produced it.
    "v_reward_by_policy": """
        SELECT w.event_time AS time, w.rollout_id AS rollout_id, w.group_id AS group_id,
               w.reward_config_id AS reward_config_id, w.raw_reward AS raw_reward, w.reward AS reward,
               w.filtered AS filtered, arrayMax(r.policy_versions) AS policy_version,
               arrayMin(r.policy_versions) AS policy_version_min
        FROM {db}.rewards AS w FINAL
        INNER JOIN (SELECT rollout_id, policy_versions FROM {db}.rollouts FINAL
                    WHERE status = 'COMPLETE' AND counted AND notEmpty(policy_versions)) AS r
            ON w.rollout_id = r.rollout_id""",
    "v_group_completion": """
        SELECT event_time AS time, group_id, status, expected_size, length(rollout_ids) AS size,
               if(expected_size IS NULL, 1.0, length(rollout_ids) / greatest(expected_size, 1)) AS fill
        FROM {db}.groups FINAL""",
    "v_incomplete_rollouts": """
        SELECT event_time AS time, rollout_id, attempt_id, attempt_number, missing, finish_status,
               length(call_ids) AS calls, length(env_event_ids) AS env_events
        FROM {db}.rollouts FINAL
        WHERE status = 'INCOMPLETE'""",
    # Adjacent call pairs whose prompt_i ‖ output_i is a token prefix of prompt_{i+1} (mergeable).
    "v_prefix_links": """
        SELECT event_time AS time, rollout_id, attempt_id, p_from_call_index AS from_call_index,
               p_to_call_index AS to_call_index, p_is_prefix AS is_prefix,
               p_common_prefix_len AS common_prefix_len, p_expected_len AS expected_len
        FROM {db}.rollouts FINAL
        ARRAY JOIN p_from_call_index, p_to_call_index, p_is_prefix, p_common_prefix_len, p_expected_len""",
    # Policy versions behind the trainer's step when it consumed each sample.
    "v_staleness": """
        SELECT t.event_time AS time, t.run_id AS run_id, t.step AS step, s.event_id AS sample_id,
               t.policy_version_before AS trainer_version, s.policy_version_first AS sample_version_first,
               s.policy_version_last AS sample_version_last,
               t.policy_version_before - s.policy_version_first AS staleness
        FROM (SELECT event_time, run_id, step, policy_version_before, sample_id
              FROM {db}.trainer_steps FINAL ARRAY JOIN sample_ids AS sample_id) AS t
        INNER JOIN (SELECT event_id, policy_version_first, policy_version_last FROM {db}.samples FINAL) AS s
            ON t.sample_id = s.event_id""",
    # Samples the trainer's staleness bound dropped, one row each (issue 19): accounted for, not lost.
    "v_stale_dropped": """
        SELECT event_time AS time, run_id, step, policy_version_before AS trainer_version, max_staleness,
               stale_rule, sample_id
        FROM {db}.trainer_steps FINAL ARRAY JOIN stale_dropped_ids AS sample_id""",
    "v_call_tokens": """
        SELECT event_time AS time, call_id, rollout_id, policy_version, model, status, prompt_length,
               output_tokens, prompt_stored_tokens, total_ms, first_token_ms,
               prompt_base_call_id IS NOT NULL AS prompt_is_delta
        FROM {db}.calls FINAL""",
    "v_tokens_per_second": """
        SELECT toStartOfMinute(event_time) AS time, count() AS calls,
               sum(output_tokens) / 60 AS output_tokens_per_s, sum(prompt_length) / 60 AS prompt_tokens_per_s,
               countIf(status = 'ERROR') AS errors
        FROM {db}.calls FINAL
        GROUP BY time""",
    **DRIFT_VIEWS,  # chat-template drift per harness, family and renderer version (sinks/ddl/drift_views.py)
}
VIEWS.update(FRESHNESS_VIEWS)  # trajectory -> sample latency, sample age at training (issue 30)


def view_sql(db: str, name: str) -> str:
    return f"CREATE OR REPLACE VIEW {db}.{name} AS {VIEWS[name].format(db=db).strip()}"
