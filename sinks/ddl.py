"""ClickHouse tables and views for every tokentrail topic, and idempotent migrations.

Every table is immutable event storage: ReplacingMergeTree whose sorting key ends in the event id, so
a re-delivered event collapses into one row at merge time (read with FINAL). Inserts also carry a
deduplication token (see sinks/sink.py), so a retried batch is dropped on arrival.

Calls' token arrays arrive as the packed little-endian bytes of the Avro record and are stored as
typed arrays (migrations 0003/0004): ids as Array(UInt32) with T64 (keeps only the bits the vocabulary
needs) then ZSTD, logprobs as Array(Float32) with ZSTD. The bytes go into EPHEMERAL columns and the
server converts them (``reinterpret``), so Python never converts; reads turn the arrays back into the
exact bytes (``packed_read_sql``). A later call's prompt is only its delta (new tokens after a prefix
of an earlier call), never the full prompt again. Rollouts do not repeat their calls' tokens: they keep
each call's lengths and hashes and are rebuilt from the calls table (sinks/store.py), so storage grows
with the rollout once. The harness request bodies, which repeat the whole conversation on every call,
are kept the same way: a later call's body as the text between what it shares with an earlier call's
body at both ends (migration 0005, sinks/request_bodies.py). Samples repeat their calls' tokens too:
where the writer proves a sample's ids are its calls' prompt ‖ output and its logprobs its calls'
sampled logprobs, those columns are stored empty, with the calls named and the length and sha256 of
what they held (migration 0006, sinks/sample_refs.py); reads rebuild and check them. The rollouts of a
group share their first prompt (the task): a full prompt already stored by another call is stored
once, the later rows naming that call (migration 0007, sinks/shared_prompts.py). Other packed
bytes (a sample's mask, advantages and weights, or ids that differ from its calls; dead letters)
stay String + ZSTD.

Tables are partitioned by day of the event's own timestamp (not the ingestion time), so every copy of
an event lands in the same partition and deduplicates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clickhouse_connect.driver.client import Client

from sinks.drift_views import DRIFT_VIEWS

TOKENS = "String CODEC(ZSTD(3))"
NTOKENS = "Nullable(String) CODEC(ZSTD(3))"
TEXT = "String CODEC(ZSTD(3))"
LC = "LowCardinality(String)"

# Columns every table has: a content hash (same event id, different content = a rewrite), and where
# the row came from. ``ingested_at`` is filled by the server.
COMMON_COLUMNS = """
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6)"""

EVENT_TIME = "event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro({col})"
TABLE_SETTINGS = "SETTINGS non_replicated_deduplication_window = 10000"


@dataclass(frozen=True)
class Table:
    name: str
    columns: str
    order_by: str
    time_column: str = "created_at_us"
    indexes: tuple[str, ...] = ()

    def create_sql(self, db: str) -> str:
        index_sql = "".join(f",\n    {ix}" for ix in self.indexes)
        return (
            f"CREATE TABLE IF NOT EXISTS {db}.{self.name} (\n{self.columns.strip(chr(10))},\n    "
            f"{EVENT_TIME.format(col=self.time_column)},{COMMON_COLUMNS}{index_sql}\n)\n"
            f"ENGINE = ReplacingMergeTree\nPARTITION BY toDate(event_time)\n"
            f"ORDER BY ({self.order_by})\n{TABLE_SETTINGS}"
        )


# As released in 0001 (migrations are never edited): the calls' token bytes columns below become
# EPHEMERAL inputs of typed arrays in 0003/0004 (see CALL_PACKED).
TABLES: tuple[Table, ...] = (
    Table(
        "calls",
        f"""
    event_id String,
    call_id String,
    rollout_id String,
    attempt_id String,
    call_index Int32,
    session_id Nullable(String),
    protocol {LC},
    streamed Bool,
    status {LC},
    error_type Nullable(String),
    error_message Nullable(String),
    error_status_code Nullable(Int32),
    prompt_length UInt32,
    prompt_sha256 String,
    prompt_ids {NTOKENS},
    prompt_base_call_id Nullable(String),
    prompt_base_prefix_len UInt32,
    prompt_new_ids {NTOKENS},
    output_ids {TOKENS},
    output_logprobs {TOKENS},
    logprob_kind {LC},
    finish_reason {LC},
    model {LC},
    policy_version Int64,
    tokenizer_fingerprint {LC},
    chat_template_fingerprint {LC},
    adapter_version {LC},
    parser_version {LC},
    engine {LC},
    upstream {LC},
    temperature Float64,
    top_p Float64,
    top_k Int32,
    max_tokens Int32,
    seed Nullable(Int64),
    stop Array(String),
    sampling_extra_json String,
    prefix_mode {LC},
    spliced_outputs Int32,
    prefix_breaks Array(String),
    received_at_us Int64,
    queue_ms Float64,
    first_token_ms Float64,
    total_ms Float64,
    request_json {TEXT},
    response_json {TEXT},
    output_tokens UInt32 MATERIALIZED intDiv(length(output_ids), 4),
    prompt_stored_tokens UInt32 MATERIALIZED
        intDiv(length(ifNull(prompt_ids, '')) + length(ifNull(prompt_new_ids, '')), 4)""",
        "rollout_id, attempt_id, call_index, event_id",
        time_column="received_at_us",
        indexes=("INDEX ix_call_id call_id TYPE bloom_filter GRANULARITY 4",),
    ),
    Table(
        "attempt_starts",
        f"""
    event_id String,
    rollout_id String,
    attempt_id String,
    group_id Nullable(String),
    group_key Map(String, String),
    expected_group_size Nullable(Int32),
    task_input_json {TEXT},
    metadata_json {TEXT},
    attempt_number Int32,
    created_at_us Int64""",
        "rollout_id, attempt_id, event_id",
    ),
    Table(
        "env_steps",
        f"""
    event_id String,
    rollout_id String,
    attempt_id String,
    event_index Int32,
    kind {LC},
    call_id Nullable(String),
    name Nullable(String),
    payload_json {TEXT},
    created_at_us Int64""",
        "rollout_id, attempt_id, event_index, event_id",
    ),
    Table(
        "attempt_finishes",
        f"""
    event_id String,
    rollout_id String,
    attempt_id String,
    status {LC},
    call_count Int32,
    event_count Int32,
    final_artifacts_json {TEXT},
    created_at_us Int64""",
        "rollout_id, attempt_id, event_id",
    ),
    Table(
        "rollouts",
        f"""
    event_id String,
    rollout_id String,
    attempt_id String,
    status {LC},
    missing Array(String),
    counted Bool,
    attempt_number Int32,
    group_id Nullable(String),
    group_key Map(String, String),
    expected_group_size Nullable(Int32),
    task_input_json {TEXT},
    metadata_json {TEXT},
    finish_status LowCardinality(Nullable(String)),
    final_artifacts_json {TEXT},
    c_call_id Array(String),
    c_call_index Array(Int32),
    c_status Array({LC}),
    c_policy_version Array(Int64),
    c_prompt_length Array(UInt32),
    c_prompt_sha256 Array(String),
    c_prompt_base_call_id Array(Nullable(String)),
    c_prompt_base_prefix_len Array(UInt32),
    c_output_tokens Array(UInt32),
    c_output_sha256 Array(String),
    c_logprobs_sha256 Array(String),
    c_logprob_kind Array({LC}),
    c_finish_reason Array({LC}),
    c_tokenizer_fingerprint Array({LC}),
    c_chat_template_fingerprint Array({LC}),
    e_event_id Array(String),
    e_event_index Array(Int32),
    e_kind Array({LC}),
    e_call_id Array(Nullable(String)),
    e_name Array(Nullable(String)),
    e_payload_json Array(String) CODEC(ZSTD(3)),
    p_from_call_index Array(Int32),
    p_to_call_index Array(Int32),
    p_is_prefix Array(Bool),
    p_common_prefix_len Array(Int32),
    p_expected_len Array(Int32),
    policy_versions Array(Int64),
    call_ids Array(String),
    env_event_ids Array(String),
    created_at_us Int64""",
        "rollout_id, attempt_id, event_id",
        indexes=("INDEX ix_group_id group_id TYPE bloom_filter GRANULARITY 4",),
    ),
    Table(
        "groups",
        f"""
    event_id String,
    group_id String,
    group_key_json String,
    status {LC},
    expected_size Nullable(Int32),
    rollout_ids Array(String),
    rollout_event_ids Array(String),
    created_at_us Int64""",
        "group_id, event_id",
        indexes=("INDEX ix_rollout_ids rollout_ids TYPE bloom_filter GRANULARITY 4",),
    ),
    # The content hash is part of the key: identical re-deliveries collapse, an edited raw score with
    # the same event id stays visible next to the original (audit: score reviewability).
    Table(
        "scores",
        f"""
    event_id String,
    rollout_id String,
    rollout_event_id String,
    group_id String,
    verifier_name {LC},
    verifier_version {LC},
    scope {LC},
    status {LC},
    raw_json {TEXT},
    error Nullable(String),
    duration_ms Float64,
    created_at_us Int64""",
        "rollout_id, event_id, content_hash",
    ),
    Table(
        "rewards",
        f"""
    event_id String,
    rollout_id String,
    group_id String,
    reward_config_id {LC},
    score_ids Array(String),
    raw_reward Float64,
    reward Float64,
    components_json {TEXT},
    filtered Bool,
    filter_reason Nullable(String),
    created_at_us Int64""",
        "rollout_id, reward_config_id, event_id",
    ),
    Table(
        "credits",
        f"""
    event_id String,
    rollout_id String,
    group_id String,
    reward_id String,
    credit_config_id {LC},
    level {LC},
    rollout_advantage Float64,
    call_ids Array(String),
    call_advantages String,
    rollout_weight Float64,
    sampled_tokens Int32,
    created_at_us Int64""",
        "rollout_id, credit_config_id, event_id",
    ),
    Table(
        "samples",
        f"""
    event_id String,
    kind {LC},
    sample_config_id {LC},
    rollout_ids Array(String),
    group_ids Array(String),
    score_ids Array(String),
    reward_ids Array(String),
    credit_ids Array(String),
    policy_version_first Int64,
    policy_version_last Int64,
    input_ids {TOKENS},
    loss_mask {TOKENS},
    rollout_logprobs {TOKENS},
    advantages {TOKENS},
    weights {TOKENS},
    sequence_starts String,
    seg_rollout_id Array(String),
    seg_call_id Array(String),
    seg_call_index Array(Int32),
    seg_source Array({LC}),
    seg_sample_start Array(UInt32),
    seg_call_start Array(UInt32),
    seg_length Array(UInt32),
    seg_weight Array(Float64),
    weight_total Float64,
    created_at_us Int64,
    rollout_id String MATERIALIZED rollout_ids[1],
    tokens UInt32 MATERIALIZED intDiv(length(input_ids), 4),
    loss_tokens UInt32 MATERIALIZED length(replaceAll(loss_mask, '\\0', ''))""",
        "rollout_id, event_id",
        indexes=(
            "INDEX ix_event_id event_id TYPE bloom_filter GRANULARITY 4",
            "INDEX ix_rollout_ids rollout_ids TYPE bloom_filter GRANULARITY 4",
        ),
    ),
    Table(
        "trainer_steps",
        """
    event_id String,
    run_id String,
    step Int64,
    policy_version_before Int64,
    policy_version_after Int64,
    sample_ids Array(String),
    tokens Int64,
    loss Float64,
    mean_ratio Float64,
    clip_fraction Float64,
    mean_advantage Float64,
    filtered_json String,
    created_at_us Int64""",
        "run_id, step, event_id",
        indexes=("INDEX ix_sample_ids sample_ids TYPE bloom_filter GRANULARITY 4",),
    ),
    Table(
        "dead_letters",
        f"""
    event_id String,
    stage {LC},
    source_topic {LC},
    source_partition Int32,
    source_offset Int64,
    key Nullable(String),
    value {TOKENS},
    error_type {LC},
    reason String,
    created_at_us Int64""",
        "source_topic, source_partition, source_offset, event_id",
    ),
)

# Tables added after 0001, each created by its own migration below.
FEEDBACK_TABLE = Table(
    "feedback",
    f"""
    event_id String,
    source {LC},
    source_feedback_id Nullable(String),
    target_kind {LC},
    target_id String,
    call_id Nullable(String),
    kind {LC},
    binary Nullable(Bool),
    rating Nullable(Float64),
    rating_min Float64,
    rating_max Float64,
    outcome Nullable(String),
    edit_distance Nullable(Float64),
    task_success Nullable(Bool),
    details_json String,
    text Nullable(String) CODEC(ZSTD(3)),
    supersedes Nullable(String),
    event_time_us Int64,
    created_at_us Int64""",
    "target_kind, target_id, event_id",
    time_column="event_time_us",  # the feedback's own time: every copy lands in the same partition
    indexes=("INDEX ix_call_id call_id TYPE bloom_filter GRANULARITY 4",),
)

RELEASE_DECISIONS_TABLE = Table(
    "release_decisions",
    f"""
    event_id String,
    model {LC},
    sequence Int64,
    release_id String,
    action {LC},
    source {LC},
    operator Nullable(String),
    serving_version Int64,
    candidate_version Nullable(Int64),
    candidate_fraction Float64,
    stage Int32,
    pinned_json String,
    plan_id {LC},
    plan_json {TEXT},
    rule {LC},
    reason String,
    alpha Nullable(Float64),
    interval_low Nullable(Float64),
    interval_high Nullable(Float64),
    serving_rewards Int64,
    serving_reward_mean Nullable(Float64),
    serving_reward_var Nullable(Float64),
    serving_calls Int64,
    serving_errors Int64,
    serving_latency_ms_mean Nullable(Float64),
    candidate_rewards Int64,
    candidate_reward_mean Nullable(Float64),
    candidate_reward_var Nullable(Float64),
    candidate_calls Int64,
    candidate_errors Int64,
    candidate_latency_ms_mean Nullable(Float64),
    created_at_us Int64""",
    "model, sequence, event_id",
)

BASELINES_TABLE = Table(
    "baselines",
    f"""
    event_id String,
    baseline_config_id {LC},
    key String,
    group_id String,
    method {LC},
    window_start_us Int64,
    window_end_us Int64,
    rollout_ids Array(String),
    rollout_event_ids Array(String),
    reward_ids Array(String),
    rewards Array(Float64),
    rollout_baselines Array(Nullable(Float64)),
    rollout_advantages Array(Nullable(Float64)),
    peer_reward_ids Array(String),
    scale Nullable(Float64),
    previous_id Nullable(String),
    count_before Int64,
    count_after Int64,
    running_before Nullable(Float64),
    running_after Nullable(Float64),
    created_at_us Int64""",
    "key, window_end_us, event_id",
    indexes=("INDEX ix_group_id group_id TYPE bloom_filter GRANULARITY 4",),
)

TABLE_NAMES: tuple[str, ...] = (*(t.name for t in TABLES), FEEDBACK_TABLE.name, RELEASE_DECISIONS_TABLE.name,
                                BASELINES_TABLE.name)

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
    **DRIFT_VIEWS,  # chat-template drift per harness, family and renderer version (sinks/drift_views.py)
}

MIGRATIONS_TABLE = "schema_migrations"

# TrainerStep v2 (issue 19); defaults match the Avro defaults, so rows stored before read as v1 events.
TRAINER_STEP_OFF_POLICY: tuple[str, ...] = (
    "mismatch_tokens Int64 DEFAULT 0 AFTER filtered_json",
    "mismatch_mean_abs Float64 DEFAULT 0 AFTER mismatch_tokens",
    "mismatch_max_abs Float64 DEFAULT 0 AFTER mismatch_mean_abs",
    "mismatch_beyond_fraction Float64 DEFAULT 0 AFTER mismatch_max_abs",
    "mismatch_bound Float64 DEFAULT 0 AFTER mismatch_beyond_fraction",
    f"importance_sampling {LC} DEFAULT 'none' AFTER mismatch_bound",
    "importance_tokens Int64 DEFAULT 0 AFTER importance_sampling",
    "importance_truncated Int64 DEFAULT 0 AFTER importance_tokens",
    "max_staleness Int64 DEFAULT -1 AFTER importance_truncated",
    f"stale_rule {LC} DEFAULT 'drop' AFTER max_staleness",
    "stale_dropped_ids Array(String) DEFAULT [] AFTER stale_rule",
    "stale_masked_tokens Int64 DEFAULT 0 AFTER stale_dropped_ids",
)


# Migration 0014: (version, start, end) spans, end exclusive, over a call's output tokens (calls, and per
# call in rollouts) or over a sample's token positions; empty (the Avro default) means one version for all.
VERSION_SPAN = "Tuple(version Int64, start UInt32, end UInt32)"
VERSION_SPAN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("calls", f"version_spans Array({VERSION_SPAN}) DEFAULT [] AFTER upstream"),
    # CallRecord.release (null: no release plan routed the call): NULL release_id and the rest NULL too.
    ("calls", "release_id Nullable(String) DEFAULT NULL"),
    ("calls", "release_decision_sequence Nullable(Int64) DEFAULT NULL AFTER release_id"),
    ("calls", "release_arm LowCardinality(Nullable(String)) DEFAULT NULL AFTER release_decision_sequence"),
    ("calls", "release_pin_label Nullable(String) DEFAULT NULL AFTER release_arm"),
    ("rollouts", f"c_version_spans Array(Array({VERSION_SPAN})) DEFAULT [] AFTER c_scripted"),
    ("samples", f"version_spans Array({VERSION_SPAN}) DEFAULT [] AFTER seg_length"),
)


# Migration 0015: TrainerStep v3 (issue 22), the trainer's resume from the last good version after a release
# rollback; defaults match the Avro defaults (a training step: -1 and empty strings).
TRAINER_STEP_RESUME: tuple[str, ...] = (
    "resumed_from_version Int64 DEFAULT -1 AFTER stale_masked_tokens",
    "rolled_back_version Int64 DEFAULT -1 AFTER resumed_from_version",
    "resume_release_id String DEFAULT '' AFTER rolled_back_version",
    "resume_decision_id String DEFAULT '' AFTER resume_release_id",
    "resume_reason String DEFAULT '' AFTER resume_decision_id",
)


@dataclass(frozen=True)
class Migration:
    id: str
    description: str
    statements: Callable[[str], list[str]]  # database name -> idempotent statements


# Append only: a migration, once released, is never edited. Schema evolution (a new Avro field with a
# default) becomes an ADD COLUMN IF NOT EXISTS whose default matches the Avro default.
MIGRATIONS: tuple[Migration, ...] = (
    Migration("0001_tables", "one immutable table per event type", lambda db: [t.create_sql(db) for t in TABLES]),
    Migration(
        "0002_rollouts_final_output_text",
        "CompletedRollout.final_output_text (schema v2)",
        lambda db: [
            f"ALTER TABLE {db}.rollouts ADD COLUMN IF NOT EXISTS final_output_text String DEFAULT '' "
            "CODEC(ZSTD(3)) AFTER final_artifacts_json"
        ],
    ),
    Migration(
        "0003_calls_token_arrays",
        "calls: typed token arrays (T64 + ZSTD), filled from the packed bytes",
        lambda db: _calls_token_arrays(f"{db}.calls"),
    ),
    Migration(
        "0004_calls_ephemeral_token_bytes",
        "calls: packed token bytes become EPHEMERAL inputs of the arrays",
        lambda db: _calls_ephemeral_token_bytes(f"{db}.calls"),
    ),
    Migration(
        "0005_calls_request_body_deltas",
        "calls: request bodies stored as verified deltas on an earlier call's body",
        lambda db: _calls_request_body_deltas(f"{db}.calls"),
    ),
    Migration(
        "0006_samples_token_references",
        "samples: input ids and rollout logprobs stored as verified references to their calls",
        lambda db: _samples_token_references(f"{db}.samples"),
    ),
    Migration(
        "0007_calls_shared_prompts",
        "calls: a full prompt already stored by another call is stored once, by reference",
        lambda db: [
            f"ALTER TABLE {db}.calls ADD COLUMN IF NOT EXISTS prompt_shared_call_id Nullable(String) "
            "AFTER prompt_base_prefix_len",
            # Sinks look up full prompts other sinks stored by their sha256 (sinks.store.stored_full_prompts).
            f"ALTER TABLE {db}.calls ADD INDEX IF NOT EXISTS ix_prompt_sha256 prompt_sha256 "
            "TYPE bloom_filter GRANULARITY 4",
        ],
    ),
    Migration(
        "0008_calls_request_response_copies",
        "calls: a delta body's copy of the base call's answer is stored as copies of its response body",
        lambda db: [
            # (position in the stored delta, offset in the base's response_json, length), code points.
            f"ALTER TABLE {db}.calls ADD COLUMN IF NOT EXISTS request_copies "
            "Array(Tuple(UInt32, UInt32, UInt32)) CODEC(ZSTD(3)) AFTER request_shared_suffix",
        ],
    ),
    Migration(
        "0009_scripted_outputs",
        "CallRecord.scripted and CompletedRollout calls[].scripted (schema v2 / v3)",
        lambda db: [
            f"ALTER TABLE {db}.calls ADD COLUMN IF NOT EXISTS scripted Bool DEFAULT false",
            f"ALTER TABLE {db}.rollouts ADD COLUMN IF NOT EXISTS c_scripted Array(Bool) DEFAULT [] "
            "AFTER c_chat_template_fingerprint",
        ],
    ),
    Migration(
        "0010_release_decisions",
        "release_decisions: which policy versions serve which share of traffic, and why (issue 22)",
        lambda db: [RELEASE_DECISIONS_TABLE.create_sql(db)],
    ),
    Migration(
        "0011_feedback",
        "feedback: outside signals about responses, calls, sessions and rollouts (issue 21)",
        lambda db: [FEEDBACK_TABLE.create_sql(db)],
    ),
    Migration(
        "0012_baselines",
        "baselines: grouping-key windows and running baselines for rollouts without siblings (issue 21)",
        lambda db: [BASELINES_TABLE.create_sql(db)],
    ),
    Migration(
        "0013_trainer_steps_off_policy",
        "trainer_steps: engine/trainer logprob mismatch, importance sampling and staleness (TrainerStep v2, issue 19)",
        lambda db: [f"ALTER TABLE {db}.trainer_steps ADD COLUMN IF NOT EXISTS {c}" for c in TRAINER_STEP_OFF_POLICY],
    ),
    Migration(
        "0014_version_spans_and_release",
        "per-token policy version spans on calls, rollouts' calls and samples; the release arm of a call "
        "(CallRecord v3, CompletedRollout v4, Sample v2; issues 19 and 22)",
        lambda db: [f"ALTER TABLE {db}.{table} ADD COLUMN IF NOT EXISTS {c}" for table, c in VERSION_SPAN_COLUMNS],
    ),
    Migration(
        "0015_trainer_steps_resume",
        "trainer_steps: the trainer's resume from the last good version after a release rollback "
        "(TrainerStep v3, issue 22)",
        lambda db: [f"ALTER TABLE {db}.trainer_steps ADD COLUMN IF NOT EXISTS {c}" for c in TRAINER_STEP_RESUME],
    ),
)


# ---- calls: packed token bytes in, typed arrays stored ---------------------------------------------


@dataclass(frozen=True)
class StoredColumn:
    """A stored column derived from a packed input: its empty default and its default from the bytes."""

    name: str
    type: str
    codec: str
    empty: str
    expr: str

    def spec(self, default: str) -> str:
        codec = f" CODEC({self.codec})" if self.codec else ""
        return f"{self.name} {self.type} DEFAULT {default}{codec}"


@dataclass(frozen=True)
class PackedColumn:
    """An Avro bytes field of packed little-endian 4-byte values (token ids or logprobs).

    ``name`` is an EPHEMERAL input taking the bytes; stored are ``{name}_arr`` (the values), ``{name}_odd``
    (the bytes verbatim when their length is not a multiple of 4, so even a malformed record stays
    exact; normally empty) and, for nullable fields, ``{name}_null``.
    """

    name: str
    element: str  # UInt32 | Float32
    codec: str
    nullable: bool = False

    @property
    def input_type(self) -> str:
        return "Nullable(String)" if self.nullable else "String"

    def _bytes(self) -> str:
        return f"ifNull({self.name}, '')" if self.nullable else self.name

    def stored(self) -> list[StoredColumn]:
        raw = self._bytes()
        whole = f"length({raw}) % 4 = 0"
        out = [
            StoredColumn(
                f"{self.name}_arr",
                f"Array({self.element})",
                self.codec,
                "[]",
                f"reinterpret(if({whole}, {raw}, ''), 'Array({self.element})')",
            ),
            StoredColumn(f"{self.name}_odd", "String", "ZSTD(3)", "''", f"if({whole}, '', {raw})"),
        ]
        if self.nullable:
            out.append(StoredColumn(f"{self.name}_null", "Bool", "", "false", f"isNull({self.name})"))
        return out


# T64 crops each 64-value block to the bits it uses (token ids need ~15-18 of 32) and ZSTD codes the
# rest; Delta would not help (ids are not monotonic). Logprobs have no integer structure: ZSTD only.
ID_CODEC = "T64, ZSTD(3)"
CALL_PACKED: tuple[PackedColumn, ...] = (
    PackedColumn("prompt_ids", "UInt32", ID_CODEC, nullable=True),
    PackedColumn("prompt_new_ids", "UInt32", ID_CODEC, nullable=True),
    PackedColumn("output_ids", "UInt32", ID_CODEC),
    PackedColumn("output_logprobs", "Float32", "ZSTD(3)"),
)
CALL_STORED: tuple[StoredColumn, ...] = tuple(s for p in CALL_PACKED for s in p.stored())
CALL_STORED_TOKEN_COLUMNS: tuple[str, ...] = tuple(s.name for s in CALL_STORED)


def packed_read_sql(name: str) -> str:
    """SQL giving the exact Avro bytes of a packed calls column (NULL where the record had null)."""
    col = next(p for p in CALL_PACKED if p.name == name)
    value = f"if({name}_odd != '', {name}_odd, reinterpretAsString({name}_arr))"
    return f"if({name}_null, NULL, {value})" if col.nullable else value


def star_columns(table: str) -> str:
    """What ``SELECT *`` means for a table's rows: the calls table's token bytes rebuilt, not its arrays."""
    if table != "calls":
        return "*"
    rebuilt = ", ".join(f"{packed_read_sql(p.name)} AS {p.name}" for p in CALL_PACKED)
    return f"* EXCEPT ({', '.join(CALL_STORED_TOKEN_COLUMNS)}), {rebuilt}"


def _calls_token_arrays(table: str) -> list[str]:
    """Add the arrays and fill them from the packed bytes already stored (safe to repeat: the bytes
    columns exist until 0004 is applied)."""
    adds = [f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {s.spec(s.empty)}" for s in CALL_STORED]
    fill = ", ".join(f"{s.name} = {s.expr}" for s in CALL_STORED)
    return [*adds, f"ALTER TABLE {table} UPDATE {fill} WHERE 1 SETTINGS mutations_sync = 2"]


def _calls_ephemeral_token_bytes(table: str) -> list[str]:
    """Replace the stored bytes by EPHEMERAL inputs. Every step can be repeated: the arrays' defaults
    are reset to constants before the inputs are (re)created, so nothing depends on a dropped column."""
    counts = [
        f"ALTER TABLE {table} MODIFY COLUMN output_tokens UInt32 MATERIALIZED "
        "length(output_ids_arr) + intDiv(length(output_ids_odd), 4)",
        f"ALTER TABLE {table} MODIFY COLUMN prompt_stored_tokens UInt32 MATERIALIZED "
        "length(prompt_ids_arr) + length(prompt_new_ids_arr) "
        "+ intDiv(length(prompt_ids_odd) + length(prompt_new_ids_odd), 4)",
    ]
    return [
        *counts,
        *(f"ALTER TABLE {table} MODIFY COLUMN {s.spec(s.empty)}" for s in CALL_STORED),
        *(f"ALTER TABLE {table} DROP COLUMN IF EXISTS {p.name}" for p in CALL_PACKED),
        *(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {p.name} {p.input_type} EPHEMERAL" for p in CALL_PACKED),
        *(f"ALTER TABLE {table} MODIFY COLUMN {s.spec(s.expr)}" for s in CALL_STORED),
    ]


def _calls_request_body_deltas(table: str) -> list[str]:
    """Where ``request_base_call_id`` is set, ``request_json`` holds only the text between the prefix and
    suffix shared with the base call's body (sinks/request_bodies.py). Rows stored before have no base,
    and an empty sha256 (nothing to check)."""
    columns = (
        "request_base_call_id Nullable(String) AFTER request_json",
        "request_shared_prefix UInt32 DEFAULT 0 AFTER request_base_call_id",
        "request_shared_suffix UInt32 DEFAULT 0 AFTER request_shared_prefix",
        "request_length UInt32 DEFAULT 0 AFTER request_shared_suffix",
        "request_sha256 String DEFAULT '' AFTER request_length",
    )
    return [f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {c}" for c in columns]


def _samples_token_references(table: str) -> list[str]:
    """Where ``input_ref_call_ids`` is not empty, ``input_ids`` is stored empty: it is the concatenation
    of each named call's prompt ‖ output (one call per sequence). Where ``logprobs_sha256`` is set,
    ``rollout_logprobs`` is stored empty: NaN outside OUTPUT segments, each segment's call's logprobs
    inside (sinks/sample_refs.py). ``input_length`` is the token count (0 on rows stored before, whose
    bytes are whole), so ``tokens`` counts either."""
    columns = (
        "input_ref_call_ids Array(String) AFTER sequence_starts",
        "input_length UInt32 DEFAULT 0 AFTER input_ref_call_ids",
        "input_sha256 String DEFAULT '' AFTER input_length",
        "logprobs_sha256 String DEFAULT '' AFTER input_sha256",
    )
    return [
        *(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {c}" for c in columns),
        f"ALTER TABLE {table} MODIFY COLUMN tokens UInt32 MATERIALIZED "
        "greatest(input_length, intDiv(length(input_ids), 4))",
    ]


def view_sql(db: str, name: str) -> str:
    return f"CREATE OR REPLACE VIEW {db}.{name} AS {VIEWS[name].format(db=db).strip()}"


def applied_migrations(client: Client, db: str) -> set[str]:
    return {row[0] for row in client.query(f"SELECT id FROM {db}.{MIGRATIONS_TABLE}").result_rows}


def migrate(client: Client, db: str | None = None) -> list[str]:
    """Create the database, tables and views; returns the ids of migrations applied now.

    Safe to run any number of times: applied migrations are recorded and every statement is itself
    idempotent (IF NOT EXISTS / OR REPLACE), so a run interrupted half-way can simply be repeated.
    """
    db = db or client.database
    client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {db}.{MIGRATIONS_TABLE} (id String, description String, "
        "applied_at DateTime64(6) DEFAULT now64(6)) ENGINE = ReplacingMergeTree ORDER BY id"
    )
    done = applied_migrations(client, db)
    applied = []
    for migration in MIGRATIONS:
        if migration.id in done:
            continue
        for statement in migration.statements(db):
            client.command(statement)
        client.insert(
            f"{db}.{MIGRATIONS_TABLE}",
            [[migration.id, migration.description]],
            column_names=["id", "description"],
        )
        applied.append(migration.id)
    for name in VIEWS:
        client.command(view_sql(db, name))
    return applied


def schema_sql(db: str) -> str:
    """The full DDL as one SQL script (for a server: `tokentrail clickhouse ddl | clickhouse-client -n`)."""
    parts = [f"CREATE DATABASE IF NOT EXISTS {db};"]
    parts += [statement + ";" for m in MIGRATIONS for statement in m.statements(db)]
    parts += [view_sql(db, name) + ";" for name in VIEWS]
    return "\n\n".join(parts) + "\n"


def readonly_user_sql(db: str, user: str, password_sha256_hex: str) -> list[str]:
    """A read-only user for dashboards (server mode only: chDB has no users or grants)."""
    return [
        f"CREATE USER IF NOT EXISTS {user} IDENTIFIED WITH sha256_hash BY '{password_sha256_hex}' "
        "SETTINGS readonly = 1",
        f"GRANT SELECT ON {db}.* TO {user}",
    ]
