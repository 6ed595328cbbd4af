"""The migrations, append only: a migration, once released, is never edited. Each is a list of idempotent
statements; schema evolution (a new Avro field with a default) becomes an ADD COLUMN IF NOT EXISTS whose
default matches the Avro default."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sinks.ddl.packed import CALL_PACKED, CALL_STORED
from sinks.ddl.tables import (
    BASELINES_TABLE,
    FEEDBACK_TABLE,
    FORGOTTEN_TABLE,
    LC,
    RELEASE_DECISIONS_TABLE,
    SUBJECT_CONTENT_COLUMNS,
    TABLE_NAMES,
    TABLES,
)
from sinks.freshness import SRC_TIME_COLUMN

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

# Migration 0016: TrainerStep v4 (issue 32), the torch.distributed ranks of a global step; old rows read as one
# process (the Avro defaults).
TRAINER_STEP_RANKS: tuple[str, ...] = (
    "ranks Int64 DEFAULT 1 AFTER resume_reason",
    "sample_ranks Array(Int64) DEFAULT [] AFTER ranks",
    "rank_tokens Array(Int64) DEFAULT [] AFTER sample_ranks",
)


@dataclass(frozen=True)
class Migration:
    id: str
    description: str
    statements: Callable[[str], list[str]]  # database name -> idempotent statements


# Append only: a migration, once released, is never edited. Schema evolution (a new Avro field with a
# default) becomes an ADD COLUMN IF NOT EXISTS whose default matches the Avro default.
# The tables there were when 0017 was released (tables created later add the column themselves).
TABLES_0017: tuple[str, ...] = tuple(name for name in TABLE_NAMES if name != FORGOTTEN_TABLE.name)

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
    Migration(
        "0016_trainer_steps_ranks",
        "trainer_steps: the torch.distributed ranks of a global step, each sample's rank and each rank's "
        "tokens (TrainerStep v4, issue 32)",
        lambda db: [f"ALTER TABLE {db}.trainer_steps ADD COLUMN IF NOT EXISTS {c}" for c in TRAINER_STEP_RANKS],
    ),
    Migration(
        "0017_src_time",
        "every table: the Kafka record timestamp the sink read (freshness, issue 30)",
        lambda db: [f"ALTER TABLE {db}.{table} ADD COLUMN IF NOT EXISTS {SRC_TIME_COLUMN}" for table in TABLES_0017],
    ),
    Migration(
        "0018_subjects",
        "the subject whose content a row carries (issue 31; null on rows stored before), and the forget "
        "requests table",
        lambda db: [
            *(f"ALTER TABLE {db}.{table} ADD COLUMN IF NOT EXISTS subject Nullable(String) DEFAULT NULL"
              for table in SUBJECT_CONTENT_COLUMNS),
            FORGOTTEN_TABLE.create_sql(db),
            f"ALTER TABLE {db}.{FORGOTTEN_TABLE.name} ADD COLUMN IF NOT EXISTS {SRC_TIME_COLUMN}",
        ],
    ),
    Migration(
        "0019_rollout_parse_failures",
        "rollouts: per call, how many errors the family's parser reported on its output (CompletedRollout v6; "
        "empty on rows stored before: not known)",
        lambda db: [f"ALTER TABLE {db}.rollouts ADD COLUMN IF NOT EXISTS c_parse_failures Array(Nullable(Int32)) "
                    "DEFAULT [] AFTER c_version_spans"],
    ),
)


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
