CREATE DATABASE IF NOT EXISTS tokentrail;

CREATE TABLE IF NOT EXISTS tokentrail.calls (
    event_id String,
    call_id String,
    rollout_id String,
    attempt_id String,
    call_index Int32,
    session_id Nullable(String),
    protocol LowCardinality(String),
    streamed Bool,
    status LowCardinality(String),
    error_type Nullable(String),
    error_message Nullable(String),
    error_status_code Nullable(Int32),
    prompt_length UInt32,
    prompt_sha256 String,
    prompt_ids Nullable(String) CODEC(ZSTD(3)),
    prompt_base_call_id Nullable(String),
    prompt_base_prefix_len UInt32,
    prompt_new_ids Nullable(String) CODEC(ZSTD(3)),
    output_ids String CODEC(ZSTD(3)),
    output_logprobs String CODEC(ZSTD(3)),
    logprob_kind LowCardinality(String),
    finish_reason LowCardinality(String),
    model LowCardinality(String),
    policy_version Int64,
    tokenizer_fingerprint LowCardinality(String),
    chat_template_fingerprint LowCardinality(String),
    adapter_version LowCardinality(String),
    parser_version LowCardinality(String),
    engine LowCardinality(String),
    upstream LowCardinality(String),
    temperature Float64,
    top_p Float64,
    top_k Int32,
    max_tokens Int32,
    seed Nullable(Int64),
    stop Array(String),
    sampling_extra_json String,
    prefix_mode LowCardinality(String),
    spliced_outputs Int32,
    prefix_breaks Array(String),
    received_at_us Int64,
    queue_ms Float64,
    first_token_ms Float64,
    total_ms Float64,
    request_json String CODEC(ZSTD(3)),
    response_json String CODEC(ZSTD(3)),
    output_tokens UInt32 MATERIALIZED intDiv(length(output_ids), 4),
    prompt_stored_tokens UInt32 MATERIALIZED
        intDiv(length(ifNull(prompt_ids, '')) + length(ifNull(prompt_new_ids, '')), 4),
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(received_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6),
    INDEX ix_call_id call_id TYPE bloom_filter GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (rollout_id, attempt_id, call_index, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.attempt_starts (
    event_id String,
    rollout_id String,
    attempt_id String,
    group_id Nullable(String),
    group_key Map(String, String),
    expected_group_size Nullable(Int32),
    task_input_json String CODEC(ZSTD(3)),
    metadata_json String CODEC(ZSTD(3)),
    attempt_number Int32,
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (rollout_id, attempt_id, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.env_steps (
    event_id String,
    rollout_id String,
    attempt_id String,
    event_index Int32,
    kind LowCardinality(String),
    call_id Nullable(String),
    name Nullable(String),
    payload_json String CODEC(ZSTD(3)),
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (rollout_id, attempt_id, event_index, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.attempt_finishes (
    event_id String,
    rollout_id String,
    attempt_id String,
    status LowCardinality(String),
    call_count Int32,
    event_count Int32,
    final_artifacts_json String CODEC(ZSTD(3)),
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (rollout_id, attempt_id, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.rollouts (
    event_id String,
    rollout_id String,
    attempt_id String,
    status LowCardinality(String),
    missing Array(String),
    counted Bool,
    attempt_number Int32,
    group_id Nullable(String),
    group_key Map(String, String),
    expected_group_size Nullable(Int32),
    task_input_json String CODEC(ZSTD(3)),
    metadata_json String CODEC(ZSTD(3)),
    finish_status LowCardinality(Nullable(String)),
    final_artifacts_json String CODEC(ZSTD(3)),
    c_call_id Array(String),
    c_call_index Array(Int32),
    c_status Array(LowCardinality(String)),
    c_policy_version Array(Int64),
    c_prompt_length Array(UInt32),
    c_prompt_sha256 Array(String),
    c_prompt_base_call_id Array(Nullable(String)),
    c_prompt_base_prefix_len Array(UInt32),
    c_output_tokens Array(UInt32),
    c_output_sha256 Array(String),
    c_logprobs_sha256 Array(String),
    c_logprob_kind Array(LowCardinality(String)),
    c_finish_reason Array(LowCardinality(String)),
    c_tokenizer_fingerprint Array(LowCardinality(String)),
    c_chat_template_fingerprint Array(LowCardinality(String)),
    e_event_id Array(String),
    e_event_index Array(Int32),
    e_kind Array(LowCardinality(String)),
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
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6),
    INDEX ix_group_id group_id TYPE bloom_filter GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (rollout_id, attempt_id, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.groups (
    event_id String,
    group_id String,
    group_key_json String,
    status LowCardinality(String),
    expected_size Nullable(Int32),
    rollout_ids Array(String),
    rollout_event_ids Array(String),
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6),
    INDEX ix_rollout_ids rollout_ids TYPE bloom_filter GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (group_id, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.scores (
    event_id String,
    rollout_id String,
    rollout_event_id String,
    group_id String,
    verifier_name LowCardinality(String),
    verifier_version LowCardinality(String),
    scope LowCardinality(String),
    status LowCardinality(String),
    raw_json String CODEC(ZSTD(3)),
    error Nullable(String),
    duration_ms Float64,
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (rollout_id, event_id, content_hash)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.rewards (
    event_id String,
    rollout_id String,
    group_id String,
    reward_config_id LowCardinality(String),
    score_ids Array(String),
    raw_reward Float64,
    reward Float64,
    components_json String CODEC(ZSTD(3)),
    filtered Bool,
    filter_reason Nullable(String),
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (rollout_id, reward_config_id, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.credits (
    event_id String,
    rollout_id String,
    group_id String,
    reward_id String,
    credit_config_id LowCardinality(String),
    level LowCardinality(String),
    rollout_advantage Float64,
    call_ids Array(String),
    call_advantages String,
    rollout_weight Float64,
    sampled_tokens Int32,
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (rollout_id, credit_config_id, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.samples (
    event_id String,
    kind LowCardinality(String),
    sample_config_id LowCardinality(String),
    rollout_ids Array(String),
    group_ids Array(String),
    score_ids Array(String),
    reward_ids Array(String),
    credit_ids Array(String),
    policy_version_first Int64,
    policy_version_last Int64,
    input_ids String CODEC(ZSTD(3)),
    loss_mask String CODEC(ZSTD(3)),
    rollout_logprobs String CODEC(ZSTD(3)),
    advantages String CODEC(ZSTD(3)),
    weights String CODEC(ZSTD(3)),
    sequence_starts String,
    seg_rollout_id Array(String),
    seg_call_id Array(String),
    seg_call_index Array(Int32),
    seg_source Array(LowCardinality(String)),
    seg_sample_start Array(UInt32),
    seg_call_start Array(UInt32),
    seg_length Array(UInt32),
    seg_weight Array(Float64),
    weight_total Float64,
    created_at_us Int64,
    rollout_id String MATERIALIZED rollout_ids[1],
    tokens UInt32 MATERIALIZED intDiv(length(input_ids), 4),
    loss_tokens UInt32 MATERIALIZED length(replaceAll(loss_mask, '\0', '')),
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6),
    INDEX ix_event_id event_id TYPE bloom_filter GRANULARITY 4,
    INDEX ix_rollout_ids rollout_ids TYPE bloom_filter GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (rollout_id, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.trainer_steps (
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
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6),
    INDEX ix_sample_ids sample_ids TYPE bloom_filter GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (run_id, step, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.dead_letters (
    event_id String,
    stage LowCardinality(String),
    source_topic LowCardinality(String),
    source_partition Int32,
    source_offset Int64,
    key Nullable(String),
    value String CODEC(ZSTD(3)),
    error_type LowCardinality(String),
    reason String,
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (source_topic, source_partition, source_offset, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

ALTER TABLE tokentrail.rollouts ADD COLUMN IF NOT EXISTS final_output_text String DEFAULT '' CODEC(ZSTD(3)) AFTER final_artifacts_json;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS prompt_ids_arr Array(UInt32) DEFAULT [] CODEC(T64, ZSTD(3));

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS prompt_ids_odd String DEFAULT '' CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS prompt_ids_null Bool DEFAULT false;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS prompt_new_ids_arr Array(UInt32) DEFAULT [] CODEC(T64, ZSTD(3));

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS prompt_new_ids_odd String DEFAULT '' CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS prompt_new_ids_null Bool DEFAULT false;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS output_ids_arr Array(UInt32) DEFAULT [] CODEC(T64, ZSTD(3));

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS output_ids_odd String DEFAULT '' CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS output_logprobs_arr Array(Float32) DEFAULT [] CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS output_logprobs_odd String DEFAULT '' CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls UPDATE prompt_ids_arr = reinterpret(if(length(ifNull(prompt_ids, '')) % 4 = 0, ifNull(prompt_ids, ''), ''), 'Array(UInt32)'), prompt_ids_odd = if(length(ifNull(prompt_ids, '')) % 4 = 0, '', ifNull(prompt_ids, '')), prompt_ids_null = isNull(prompt_ids), prompt_new_ids_arr = reinterpret(if(length(ifNull(prompt_new_ids, '')) % 4 = 0, ifNull(prompt_new_ids, ''), ''), 'Array(UInt32)'), prompt_new_ids_odd = if(length(ifNull(prompt_new_ids, '')) % 4 = 0, '', ifNull(prompt_new_ids, '')), prompt_new_ids_null = isNull(prompt_new_ids), output_ids_arr = reinterpret(if(length(output_ids) % 4 = 0, output_ids, ''), 'Array(UInt32)'), output_ids_odd = if(length(output_ids) % 4 = 0, '', output_ids), output_logprobs_arr = reinterpret(if(length(output_logprobs) % 4 = 0, output_logprobs, ''), 'Array(Float32)'), output_logprobs_odd = if(length(output_logprobs) % 4 = 0, '', output_logprobs) WHERE 1 SETTINGS mutations_sync = 2;

ALTER TABLE tokentrail.calls MODIFY COLUMN output_tokens UInt32 MATERIALIZED length(output_ids_arr) + intDiv(length(output_ids_odd), 4);

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_stored_tokens UInt32 MATERIALIZED length(prompt_ids_arr) + length(prompt_new_ids_arr) + intDiv(length(prompt_ids_odd) + length(prompt_new_ids_odd), 4);

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_ids_arr Array(UInt32) DEFAULT [] CODEC(T64, ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_ids_odd String DEFAULT '' CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_ids_null Bool DEFAULT false;

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_new_ids_arr Array(UInt32) DEFAULT [] CODEC(T64, ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_new_ids_odd String DEFAULT '' CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_new_ids_null Bool DEFAULT false;

ALTER TABLE tokentrail.calls MODIFY COLUMN output_ids_arr Array(UInt32) DEFAULT [] CODEC(T64, ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN output_ids_odd String DEFAULT '' CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN output_logprobs_arr Array(Float32) DEFAULT [] CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN output_logprobs_odd String DEFAULT '' CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls DROP COLUMN IF EXISTS prompt_ids;

ALTER TABLE tokentrail.calls DROP COLUMN IF EXISTS prompt_new_ids;

ALTER TABLE tokentrail.calls DROP COLUMN IF EXISTS output_ids;

ALTER TABLE tokentrail.calls DROP COLUMN IF EXISTS output_logprobs;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS prompt_ids Nullable(String) EPHEMERAL;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS prompt_new_ids Nullable(String) EPHEMERAL;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS output_ids String EPHEMERAL;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS output_logprobs String EPHEMERAL;

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_ids_arr Array(UInt32) DEFAULT reinterpret(if(length(ifNull(prompt_ids, '')) % 4 = 0, ifNull(prompt_ids, ''), ''), 'Array(UInt32)') CODEC(T64, ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_ids_odd String DEFAULT if(length(ifNull(prompt_ids, '')) % 4 = 0, '', ifNull(prompt_ids, '')) CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_ids_null Bool DEFAULT isNull(prompt_ids);

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_new_ids_arr Array(UInt32) DEFAULT reinterpret(if(length(ifNull(prompt_new_ids, '')) % 4 = 0, ifNull(prompt_new_ids, ''), ''), 'Array(UInt32)') CODEC(T64, ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_new_ids_odd String DEFAULT if(length(ifNull(prompt_new_ids, '')) % 4 = 0, '', ifNull(prompt_new_ids, '')) CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN prompt_new_ids_null Bool DEFAULT isNull(prompt_new_ids);

ALTER TABLE tokentrail.calls MODIFY COLUMN output_ids_arr Array(UInt32) DEFAULT reinterpret(if(length(output_ids) % 4 = 0, output_ids, ''), 'Array(UInt32)') CODEC(T64, ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN output_ids_odd String DEFAULT if(length(output_ids) % 4 = 0, '', output_ids) CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN output_logprobs_arr Array(Float32) DEFAULT reinterpret(if(length(output_logprobs) % 4 = 0, output_logprobs, ''), 'Array(Float32)') CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls MODIFY COLUMN output_logprobs_odd String DEFAULT if(length(output_logprobs) % 4 = 0, '', output_logprobs) CODEC(ZSTD(3));

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS request_base_call_id Nullable(String) AFTER request_json;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS request_shared_prefix UInt32 DEFAULT 0 AFTER request_base_call_id;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS request_shared_suffix UInt32 DEFAULT 0 AFTER request_shared_prefix;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS request_length UInt32 DEFAULT 0 AFTER request_shared_suffix;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS request_sha256 String DEFAULT '' AFTER request_length;

ALTER TABLE tokentrail.samples ADD COLUMN IF NOT EXISTS input_ref_call_ids Array(String) AFTER sequence_starts;

ALTER TABLE tokentrail.samples ADD COLUMN IF NOT EXISTS input_length UInt32 DEFAULT 0 AFTER input_ref_call_ids;

ALTER TABLE tokentrail.samples ADD COLUMN IF NOT EXISTS input_sha256 String DEFAULT '' AFTER input_length;

ALTER TABLE tokentrail.samples ADD COLUMN IF NOT EXISTS logprobs_sha256 String DEFAULT '' AFTER input_sha256;

ALTER TABLE tokentrail.samples MODIFY COLUMN tokens UInt32 MATERIALIZED greatest(input_length, intDiv(length(input_ids), 4));

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS prompt_shared_call_id Nullable(String) AFTER prompt_base_prefix_len;

ALTER TABLE tokentrail.calls ADD INDEX IF NOT EXISTS ix_prompt_sha256 prompt_sha256 TYPE bloom_filter GRANULARITY 4;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS request_copies Array(Tuple(UInt32, UInt32, UInt32)) CODEC(ZSTD(3)) AFTER request_shared_suffix;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS scripted Bool DEFAULT false;

ALTER TABLE tokentrail.rollouts ADD COLUMN IF NOT EXISTS c_scripted Array(Bool) DEFAULT [] AFTER c_chat_template_fingerprint;

CREATE TABLE IF NOT EXISTS tokentrail.release_decisions (
    event_id String,
    model LowCardinality(String),
    sequence Int64,
    release_id String,
    action LowCardinality(String),
    source LowCardinality(String),
    operator Nullable(String),
    serving_version Int64,
    candidate_version Nullable(Int64),
    candidate_fraction Float64,
    stage Int32,
    pinned_json String,
    plan_id LowCardinality(String),
    plan_json String CODEC(ZSTD(3)),
    rule LowCardinality(String),
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
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (model, sequence, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.feedback (
    event_id String,
    source LowCardinality(String),
    source_feedback_id Nullable(String),
    target_kind LowCardinality(String),
    target_id String,
    call_id Nullable(String),
    kind LowCardinality(String),
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
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(event_time_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6),
    INDEX ix_call_id call_id TYPE bloom_filter GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (target_kind, target_id, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS tokentrail.baselines (
    event_id String,
    baseline_config_id LowCardinality(String),
    key String,
    group_id String,
    method LowCardinality(String),
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
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6),
    INDEX ix_group_id group_id TYPE bloom_filter GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (key, window_end_us, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS mismatch_tokens Int64 DEFAULT 0 AFTER filtered_json;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS mismatch_mean_abs Float64 DEFAULT 0 AFTER mismatch_tokens;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS mismatch_max_abs Float64 DEFAULT 0 AFTER mismatch_mean_abs;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS mismatch_beyond_fraction Float64 DEFAULT 0 AFTER mismatch_max_abs;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS mismatch_bound Float64 DEFAULT 0 AFTER mismatch_beyond_fraction;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS importance_sampling LowCardinality(String) DEFAULT 'none' AFTER mismatch_bound;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS importance_tokens Int64 DEFAULT 0 AFTER importance_sampling;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS importance_truncated Int64 DEFAULT 0 AFTER importance_tokens;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS max_staleness Int64 DEFAULT -1 AFTER importance_truncated;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS stale_rule LowCardinality(String) DEFAULT 'drop' AFTER max_staleness;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS stale_dropped_ids Array(String) DEFAULT [] AFTER stale_rule;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS stale_masked_tokens Int64 DEFAULT 0 AFTER stale_dropped_ids;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS version_spans Array(Tuple(version Int64, start UInt32, end UInt32)) DEFAULT [] AFTER upstream;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS release_id Nullable(String) DEFAULT NULL;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS release_decision_sequence Nullable(Int64) DEFAULT NULL AFTER release_id;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS release_arm LowCardinality(Nullable(String)) DEFAULT NULL AFTER release_decision_sequence;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS release_pin_label Nullable(String) DEFAULT NULL AFTER release_arm;

ALTER TABLE tokentrail.rollouts ADD COLUMN IF NOT EXISTS c_version_spans Array(Array(Tuple(version Int64, start UInt32, end UInt32))) DEFAULT [] AFTER c_scripted;

ALTER TABLE tokentrail.samples ADD COLUMN IF NOT EXISTS version_spans Array(Tuple(version Int64, start UInt32, end UInt32)) DEFAULT [] AFTER seg_length;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS resumed_from_version Int64 DEFAULT -1 AFTER stale_masked_tokens;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS rolled_back_version Int64 DEFAULT -1 AFTER resumed_from_version;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS resume_release_id String DEFAULT '' AFTER rolled_back_version;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS resume_decision_id String DEFAULT '' AFTER resume_release_id;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS resume_reason String DEFAULT '' AFTER resume_decision_id;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS ranks Int64 DEFAULT 1 AFTER resume_reason;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS sample_ranks Array(Int64) DEFAULT [] AFTER ranks;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS rank_tokens Array(Int64) DEFAULT [] AFTER sample_ranks;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.attempt_starts ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.env_steps ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.attempt_finishes ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.rollouts ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.groups ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.scores ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.rewards ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.credits ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.samples ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.trainer_steps ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.dead_letters ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.feedback ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.release_decisions ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.baselines ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.calls ADD COLUMN IF NOT EXISTS subject Nullable(String) DEFAULT NULL;

ALTER TABLE tokentrail.attempt_starts ADD COLUMN IF NOT EXISTS subject Nullable(String) DEFAULT NULL;

ALTER TABLE tokentrail.env_steps ADD COLUMN IF NOT EXISTS subject Nullable(String) DEFAULT NULL;

ALTER TABLE tokentrail.attempt_finishes ADD COLUMN IF NOT EXISTS subject Nullable(String) DEFAULT NULL;

ALTER TABLE tokentrail.rollouts ADD COLUMN IF NOT EXISTS subject Nullable(String) DEFAULT NULL;

ALTER TABLE tokentrail.samples ADD COLUMN IF NOT EXISTS subject Nullable(String) DEFAULT NULL;

ALTER TABLE tokentrail.feedback ADD COLUMN IF NOT EXISTS subject Nullable(String) DEFAULT NULL;

ALTER TABLE tokentrail.dead_letters ADD COLUMN IF NOT EXISTS subject Nullable(String) DEFAULT NULL;

CREATE TABLE IF NOT EXISTS tokentrail.forgotten (
    event_id String,
    request_id String,
    subject String,
    requested_by String,
    reason String,
    key_ids Array(String),
    requested_at_us Int64,
    created_at_us Int64,
    event_time DateTime64(6) MATERIALIZED fromUnixTimestamp64Micro(created_at_us),
    content_hash String,
    src_topic LowCardinality(String) DEFAULT '',
    src_partition Int32 DEFAULT -1,
    src_offset Int64 DEFAULT -1,
    ingested_at DateTime64(6) DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (subject, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

ALTER TABLE tokentrail.forgotten ADD COLUMN IF NOT EXISTS src_time_ms Int64 DEFAULT -1 AFTER src_offset;

ALTER TABLE tokentrail.rollouts ADD COLUMN IF NOT EXISTS c_parse_failures Array(Nullable(Int32)) DEFAULT [] AFTER c_version_spans;

CREATE OR REPLACE VIEW tokentrail.env_events AS SELECT event_id, rollout_id, attempt_id, 'AttemptStarted' AS event_type, created_at_us
        FROM tokentrail.attempt_starts FINAL
        UNION ALL
        SELECT event_id, rollout_id, attempt_id, 'EnvStep' AS event_type, created_at_us
        FROM tokentrail.env_steps FINAL
        UNION ALL
        SELECT event_id, rollout_id, attempt_id, 'AttemptFinished' AS event_type, created_at_us
        FROM tokentrail.attempt_finishes FINAL;

CREATE OR REPLACE VIEW tokentrail.sample_segments AS SELECT event_id AS sample_id, sample_config_id, kind AS sample_kind, seg_rollout_id AS rollout_id,
               seg_call_id AS call_id, seg_call_index AS call_index, seg_source AS source,
               seg_sample_start AS sample_start, seg_call_start AS call_start, seg_length AS length,
               input_ids, loss_mask, weights
        FROM tokentrail.samples FINAL
        ARRAY JOIN seg_rollout_id, seg_call_id, seg_call_index, seg_source, seg_sample_start,
                   seg_call_start, seg_length;

CREATE OR REPLACE VIEW tokentrail.v_reward_by_policy AS SELECT w.event_time AS time, w.rollout_id AS rollout_id, w.group_id AS group_id,
               w.reward_config_id AS reward_config_id, w.raw_reward AS raw_reward, w.reward AS reward,
               w.filtered AS filtered, arrayMax(r.policy_versions) AS policy_version,
               arrayMin(r.policy_versions) AS policy_version_min
        FROM tokentrail.rewards AS w FINAL
        INNER JOIN (SELECT rollout_id, policy_versions FROM tokentrail.rollouts FINAL
                    WHERE status = 'COMPLETE' AND counted AND notEmpty(policy_versions)) AS r
            ON w.rollout_id = r.rollout_id;

CREATE OR REPLACE VIEW tokentrail.v_group_completion AS SELECT event_time AS time, group_id, status, expected_size, length(rollout_ids) AS size,
               if(expected_size IS NULL, 1.0, length(rollout_ids) / greatest(expected_size, 1)) AS fill
        FROM tokentrail.groups FINAL;

CREATE OR REPLACE VIEW tokentrail.v_incomplete_rollouts AS SELECT event_time AS time, rollout_id, attempt_id, attempt_number, missing, finish_status,
               length(call_ids) AS calls, length(env_event_ids) AS env_events
        FROM tokentrail.rollouts FINAL
        WHERE status = 'INCOMPLETE';

CREATE OR REPLACE VIEW tokentrail.v_prefix_links AS SELECT event_time AS time, rollout_id, attempt_id, p_from_call_index AS from_call_index,
               p_to_call_index AS to_call_index, p_is_prefix AS is_prefix,
               p_common_prefix_len AS common_prefix_len, p_expected_len AS expected_len
        FROM tokentrail.rollouts FINAL
        ARRAY JOIN p_from_call_index, p_to_call_index, p_is_prefix, p_common_prefix_len, p_expected_len;

CREATE OR REPLACE VIEW tokentrail.v_staleness AS SELECT t.event_time AS time, t.run_id AS run_id, t.step AS step, s.event_id AS sample_id,
               t.policy_version_before AS trainer_version, s.policy_version_first AS sample_version_first,
               s.policy_version_last AS sample_version_last,
               t.policy_version_before - s.policy_version_first AS staleness
        FROM (SELECT event_time, run_id, step, policy_version_before, sample_id
              FROM tokentrail.trainer_steps FINAL ARRAY JOIN sample_ids AS sample_id) AS t
        INNER JOIN (SELECT event_id, policy_version_first, policy_version_last FROM tokentrail.samples FINAL) AS s
            ON t.sample_id = s.event_id;

CREATE OR REPLACE VIEW tokentrail.v_stale_dropped AS SELECT event_time AS time, run_id, step, policy_version_before AS trainer_version, max_staleness,
               stale_rule, sample_id
        FROM tokentrail.trainer_steps FINAL ARRAY JOIN stale_dropped_ids AS sample_id;

CREATE OR REPLACE VIEW tokentrail.v_call_tokens AS SELECT event_time AS time, call_id, rollout_id, policy_version, model, status, prompt_length,
               output_tokens, prompt_stored_tokens, total_ms, first_token_ms,
               prompt_base_call_id IS NOT NULL AS prompt_is_delta
        FROM tokentrail.calls FINAL;

CREATE OR REPLACE VIEW tokentrail.v_tokens_per_second AS SELECT toStartOfMinute(event_time) AS time, count() AS calls,
               sum(output_tokens) / 60 AS output_tokens_per_s, sum(prompt_length) / 60 AS prompt_tokens_per_s,
               countIf(status = 'ERROR') AS errors
        FROM tokentrail.calls FINAL
        GROUP BY time;

CREATE OR REPLACE VIEW tokentrail.v_attempt_harness AS SELECT rollout_id, attempt_id, argMin(multiIf(JSONExtractString(request_json, 'headers', 'user-agent') LIKE 'claude-cli/%', 'claude-code', JSONExtractString(request_json, 'headers', 'user-agent') LIKE 'codex%' OR JSONExtractString(request_json, 'headers', 'originator') LIKE 'codex%', 'codex', positionCaseInsensitive(request_json, 'openclaw') > 0, 'openclaw', position(request_json, 'inside pi, a coding agent harness') > 0, 'pi', JSONExtractString(request_json, 'headers', 'user-agent') = '', 'unknown', JSONExtractString(request_json, 'headers', 'user-agent')), call_index) AS harness
        FROM tokentrail.calls FINAL
        WHERE request_base_call_id IS NULL
        GROUP BY rollout_id, attempt_id;

CREATE OR REPLACE VIEW tokentrail.v_call_conformance AS SELECT c.event_time AS time, c.call_id AS call_id, c.rollout_id AS rollout_id, c.call_index AS call_index,
               ifNull(h.harness, 'unknown') AS harness, if(match(parser_version, '^[a-z0-9.-]+: '), extract(parser_version, '^([a-z0-9.-]+): '), 'reference') AS family,
               c.chat_template_fingerprint AS template_fingerprint, c.parser_version AS parser_version,
               c.spliced_outputs AS spliced_outputs, length(c.prefix_breaks) AS prefix_breaks,
               JSONLength(c.sampling_extra_json, 'parse_errors') AS parse_errors,
               JSONExtractArrayRaw(c.sampling_extra_json, 'parse_errors') AS parse_error_texts
        FROM tokentrail.calls AS c FINAL
        LEFT JOIN tokentrail.v_attempt_harness AS h ON c.rollout_id = h.rollout_id AND c.attempt_id = h.attempt_id;

CREATE OR REPLACE VIEW tokentrail.v_prefix_break_causes AS SELECT time, call_id, rollout_id, harness, family, template_fingerprint, parser_version, cause
        FROM (SELECT c.event_time AS time, c.call_id AS call_id, c.rollout_id AS rollout_id,
                     ifNull(h.harness, 'unknown') AS harness, if(match(parser_version, '^[a-z0-9.-]+: '), extract(parser_version, '^([a-z0-9.-]+): '), 'reference') AS family,
                     c.chat_template_fingerprint AS template_fingerprint, c.parser_version AS parser_version,
                     c.prefix_breaks AS breaks
              FROM tokentrail.calls AS c FINAL
              LEFT JOIN tokentrail.v_attempt_harness AS h
                  ON c.rollout_id = h.rollout_id AND c.attempt_id = h.attempt_id
              WHERE notEmpty(c.prefix_breaks))
        ARRAY JOIN arrayFlatten(arrayMap(brk -> if(match(brk, '^[a-z0-9.-]+ format: '), splitByString(', ', replaceRegexpOne(brk, '^[a-z0-9.-]+ format: ', '')), [trimBoth(replaceRegexpOne(replaceRegexpOne(brk, '^(call [0-9]+(, message [0-9]+)?|message [0-9]+|prompt): ', ''), '\\s*[(;].*$', ''))]), breaks)) AS cause;

CREATE OR REPLACE VIEW tokentrail.v_family_drift AS SELECT toStartOfMinute(c.time) AS time, c.harness AS harness, c.family AS family,
               c.template_fingerprint AS template_fingerprint, c.parser_version AS parser_version,
               count() AS calls, countIf(c.spliced_outputs > 0) AS spliced_calls,
               countIf(c.prefix_breaks > 0) AS calls_with_breaks, sum(c.prefix_breaks) AS breaks,
               countIf(c.parse_errors > 0) AS parse_failures
        FROM tokentrail.v_call_conformance AS c
        GROUP BY time, harness, family, template_fingerprint, parser_version;

CREATE OR REPLACE VIEW tokentrail.v_sample_latency AS SELECT s.time AS time, s.sample_id AS sample_id, r.rollout_id AS rollout_id,
               r.finished_us AS finished_at_us, s.ready_us AS group_ready_at_us,
               (r.on_kafka_ms * 1000 - r.finished_us) / 1000 AS finish_to_rollout_ms,
               (s.on_kafka_ms * 1000 - s.ready_us) / 1000 AS ready_to_sample_ms,
               (s.on_kafka_ms * 1000 - r.finished_us) / 1000 AS finish_to_sample_ms
        FROM (SELECT event_time AS time, event_id AS sample_id, created_at_us AS ready_us,
                     src_time_ms AS on_kafka_ms, rid
              FROM tokentrail.samples FINAL ARRAY JOIN rollout_ids AS rid WHERE src_time_ms >= 0) AS s
        INNER JOIN (SELECT rollout_id, created_at_us AS finished_us, src_time_ms AS on_kafka_ms
                    FROM tokentrail.rollouts FINAL WHERE status = 'COMPLETE' AND counted AND src_time_ms >= 0) AS r
            ON s.rid = r.rollout_id;

CREATE OR REPLACE VIEW tokentrail.v_sample_age AS SELECT t.time AS time, t.run_id AS run_id, t.step AS step, t.sample_id AS sample_id,
               t.trainer_version AS trainer_version, s.version_first AS sample_version_first,
               t.trainer_version - s.version_first AS age_versions,
               (t.step_us - s.ready_us) / 1e6 AS age_s
        FROM (SELECT event_time AS time, run_id, step, policy_version_before AS trainer_version,
                     created_at_us AS step_us, sample_id
              FROM tokentrail.trainer_steps FINAL ARRAY JOIN sample_ids AS sample_id) AS t
        INNER JOIN (SELECT event_id AS sample_id, policy_version_first AS version_first, created_at_us AS ready_us
                    FROM tokentrail.samples FINAL) AS s
            ON t.sample_id = s.sample_id;
