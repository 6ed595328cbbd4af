"""The tables, one per event type: column types, the released 0001 tables and those added after.

Every table is immutable event storage: ReplacingMergeTree whose sorting key ends in the event id, so a
re-delivered event collapses into one row at merge time (read with FINAL). Tables are partitioned by day
of the event's own timestamp (not the ingestion time), so every copy of an event lands in the same
partition and deduplicates. What the tables become after 0001 is in migrations.py.
"""

from __future__ import annotations

from dataclasses import dataclass

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

# Forget requests (issue 31, migration 0018): who asked, when, which subject and keys; never content.
FORGOTTEN_TABLE = Table(
    "forgotten",
    """
    event_id String,
    request_id String,
    subject String,
    requested_by String,
    reason String,
    key_ids Array(String),
    requested_at_us Int64,
    created_at_us Int64""",
    "subject, event_id",
)

# The tables that carry a subject's content (their ``subject`` column came in migration 0018), and the
# columns of each that hold content: what a forget blanks and what retention's TTL clears.
SUBJECT_CONTENT_COLUMNS: dict[str, tuple[str, ...]] = {
    "calls": ("request_json", "response_json"),
    "attempt_starts": ("task_input_json",),
    "env_steps": ("payload_json",),
    "attempt_finishes": ("final_artifacts_json",),
    "rollouts": ("task_input_json", "final_artifacts_json", "final_output_text", "e_payload_json"),
    "samples": ("input_ids",),
    "feedback": ("details_json", "text"),
    "dead_letters": ("value",),
}

TABLE_NAMES: tuple[str, ...] = (*(t.name for t in TABLES), FEEDBACK_TABLE.name, RELEASE_DECISIONS_TABLE.name,
                                BASELINES_TABLE.name, FORGOTTEN_TABLE.name)
