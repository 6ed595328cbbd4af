"""Pure mapping between decoded Avro records and ClickHouse rows (and back).

``to_row(name, record)`` gives the table and the row (a dict of column -> value) for any event;
``from_row(table, row)`` rebuilds the Avro record. Rollouts are stored without their calls' token
bytes (the calls table has them): ``rollout_from_row`` takes a lookup of the calls' tokens and checks
every rebuilt array against the hashes the row keeps.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import fastavro
import numpy as np
import numpy.typing as npt

from schemas.codec import get_codec
from schemas.ids import ids_digest
from schemas.tokens import IdArray, unpack_floats, unpack_ids
from sinks.text_delta import text_digest

Record = dict[str, Any]
Row = dict[str, Any]


@cache
def call_version_fields() -> tuple[str, ...]:
    """The fields of a call's ``versions`` (the contract's ``CallVersions``), each a column of the calls table:
    read from the schema, so a version field added there is mapped both ways without another list here."""
    versions = next(f for f in get_codec().store.schema("CallRecord").raw["fields"] if f["name"] == "versions")
    return tuple(f["name"] for f in versions["type"]["fields"])

TABLE_OF: dict[str, str] = {
    "CallRecord": "calls",
    "AttemptStarted": "attempt_starts",
    "EnvStep": "env_steps",
    "AttemptFinished": "attempt_finishes",
    "CompletedRollout": "rollouts",
    "RolloutGroup": "groups",
    "Score": "scores",
    "Reward": "rewards",
    "Credit": "credits",
    "Sample": "samples",
    "TrainerStep": "trainer_steps",
    "DeadLetter": "dead_letters",
    "Feedback": "feedback",
    "ReleaseDecision": "release_decisions",
    "Baseline": "baselines",
    "Forgotten": "forgotten",
}
RECORD_OF: dict[str, str] = {table: name for name, table in TABLE_OF.items()}

# Columns holding raw bytes (packed tokens, payloads): read them back as bytes, not text.
BINARY_COLUMNS: dict[str, tuple[str, ...]] = {
    "calls": ("prompt_ids", "prompt_new_ids", "output_ids", "output_logprobs"),
    "credits": ("call_advantages",),
    "samples": ("input_ids", "loss_mask", "rollout_logprobs", "advantages", "weights", "sequence_starts"),
    "dead_letters": ("key", "value"),
}

# Fields that say when something was written, not what it is; left out of the content hash so a
# re-derived event with the same meaning hashes the same.
VOLATILE_FIELDS = frozenset({"created_at_us", "duration_ms"})


class RowError(ValueError):
    """A record that cannot become a row (or a row that cannot become its record again)."""


def column_formats(table: str) -> dict[str, str]:
    return dict.fromkeys(BINARY_COLUMNS.get(table, ()), "bytes")


def content_hash(name: str, record: Record) -> str:
    """sha256 of the record's Avro encoding under its current schema, volatile fields zeroed."""
    stable = {k: (0 if k in VOLATILE_FIELDS else v) for k, v in record.items()}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, get_codec().store.schema(name).parsed, stable)
    return hashlib.sha256(buf.getvalue()).hexdigest()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- record -> row -------------------------------------------------------------------------------


# Never a column: ClickHouse keeps content opened (a forget blanks it there), never the sealed envelope.
NOT_STORED = frozenset({"sealed"})


def _flat(record: Record, renames: dict[str, str] | None = None) -> Row:
    renames = renames or {}
    return {renames.get(k, k): v for k, v in record.items() if k not in NOT_STORED}


def call_row(rec: Record) -> Row:
    err = rec.get("error")
    prompt, versions, sampling, timings = rec["prompt"], rec["versions"], rec["sampling"], rec["timings"]
    return {
        "event_id": rec["event_id"],
        "call_id": rec["call_id"],
        "rollout_id": rec["rollout_id"],
        "attempt_id": rec["attempt_id"],
        "call_index": rec["call_index"],
        "session_id": rec.get("session_id"),
        "subject": rec.get("subject"),
        "protocol": rec["protocol"],
        "streamed": rec["streamed"],
        "status": rec["status"],
        "error_type": err["type"] if err else None,
        "error_message": err["message"] if err else None,
        "error_status_code": err["status_code"] if err else None,
        "prompt_length": prompt["length"],
        "prompt_sha256": prompt["sha256"],
        "prompt_ids": prompt.get("ids"),
        "prompt_base_call_id": prompt.get("base_call_id"),
        "prompt_base_prefix_len": prompt["base_prefix_len"],
        "prompt_new_ids": prompt.get("new_ids"),
        # Storage only: the sink may store an identical full prompt once (sinks/shared_prompts.py).
        "prompt_shared_call_id": None,
        "output_ids": rec["output_ids"],
        "output_logprobs": rec["output_logprobs"],
        "logprob_kind": rec["logprob_kind"],
        "finish_reason": rec["finish_reason"],
        **{k: versions[k] for k in call_version_fields()},
        **{k: sampling[k] for k in ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop")},
        "sampling_extra_json": sampling["extra_json"],
        "prefix_mode": rec["prefix_mode"],
        "spliced_outputs": rec["spliced_outputs"],
        "prefix_breaks": rec["prefix_breaks"],
        **{k: timings[k] for k in ("received_at_us", "queue_ms", "first_token_ms", "total_ms")},
        "request_json": rec["request_json"],
        "response_json": rec["response_json"],
        # Stored in full here; the sink may rewrite it as a delta (sinks/request_bodies.py).
        "request_base_call_id": None,
        "request_shared_prefix": 0,
        "request_shared_suffix": 0,
        "request_copies": [],
        "request_length": len(rec["request_json"]),
        "request_sha256": text_digest(rec["request_json"]),
        "scripted": rec.get("scripted", False),
        "version_spans": span_tuples(rec.get("version_spans") or []),
        **release_columns(rec.get("release")),
    }


# CallRecord.release's fields -> the calls table's columns (migration 0014).
RELEASE_COLUMNS = {"release_id": "release_id", "decision_sequence": "release_decision_sequence",
                   "arm": "release_arm", "pin_label": "release_pin_label"}


def release_columns(release: Record | None) -> Row:
    """CallRecord.release as the calls table's columns (all NULL when no release plan routed the call)."""
    return {column: None if release is None else release[f] for f, column in RELEASE_COLUMNS.items()}


def release_from_columns(row: Row) -> Record | None:
    if row.get("release_id") is None:  # also rows stored before migration 0014: the schema's default
        return None
    return {f: row[column] for f, column in RELEASE_COLUMNS.items()}


def span_tuples(spans: list[Record]) -> list[tuple[int, int, int]]:
    """VersionSpan records as the (version, start, end) tuples of a ClickHouse column."""
    return [(int(s["version"]), int(s["start"]), int(s["end"])) for s in spans]


def span_records(column: Any) -> list[Record]:
    """A version-span column back as VersionSpan records (tuples, or dicts for named tuples)."""
    out = []
    for span in column or ():
        version, start, end = (span["version"], span["start"], span["end"]) if isinstance(span, dict) else span
        out.append({"version": int(version), "start": int(start), "end": int(end)})
    return out


ROLLOUT_CALL_FIELDS = (
    "call_id",
    "call_index",
    "status",
    "policy_version",
    "logprob_kind",
    "finish_reason",
    "tokenizer_fingerprint",
    "chat_template_fingerprint",
    "scripted",
)
ROLLOUT_ENV_FIELDS = ("event_id", "event_index", "kind", "call_id", "name", "payload_json")
PREFIX_LINK_FIELDS = ("from_call_index", "to_call_index", "is_prefix", "common_prefix_len", "expected_len")


def rollout_row(rec: Record) -> Row:
    """The rollout without its calls' token bytes: lengths and sha256s instead (calls table has bytes)."""
    row = {k: v for k, v in rec.items() if k not in ("calls", "env_events", "prefix_links", *NOT_STORED)}
    calls, envs, links = rec["calls"], rec["env_events"], rec["prefix_links"]
    for f in ROLLOUT_CALL_FIELDS:
        row[f"c_{f}"] = [c[f] for c in calls]
    row["c_prompt_length"] = [c["prompt"]["length"] for c in calls]
    row["c_prompt_sha256"] = [c["prompt"]["sha256"] for c in calls]
    row["c_prompt_base_call_id"] = [c["prompt"].get("base_call_id") for c in calls]
    row["c_prompt_base_prefix_len"] = [c["prompt"]["base_prefix_len"] for c in calls]
    for c in calls:
        if len(c["output_ids"]) % 4:
            raise RowError(f"rollout {rec['rollout_id']} call {c['call_id']}: output_ids not packed uint32")
    row["c_output_tokens"] = [len(c["output_ids"]) // 4 for c in calls]
    row["c_output_sha256"] = [_sha(c["output_ids"]) for c in calls]
    row["c_logprobs_sha256"] = [_sha(c["output_logprobs"]) for c in calls]
    row["c_version_spans"] = [span_tuples(c.get("version_spans") or []) for c in calls]
    row["c_parse_failures"] = [c.get("parse_failures") for c in calls]
    for f in ROLLOUT_ENV_FIELDS:
        row[f"e_{f}"] = [e[f] for e in envs]
    for f in PREFIX_LINK_FIELDS:
        row[f"p_{f}"] = [p[f] for p in links]
    return row


SEGMENT_FIELDS = ("rollout_id", "call_id", "call_index", "source", "sample_start", "call_start", "length")


def sample_row(rec: Record) -> Row:
    n = len(rec["input_ids"])
    if n % 4:
        raise RowError(f"sample {rec['event_id']}: input_ids has {n} bytes, not packed uint32")
    tokens = n // 4
    for field, width in (("loss_mask", 1), ("rollout_logprobs", 4), ("advantages", 4), ("weights", 4)):
        if len(rec[field]) != tokens * width:
            raise RowError(f"sample {rec['event_id']}: {field} has {len(rec[field])} bytes for {tokens} tokens")
    for seg in rec["segments"]:
        if seg["sample_start"] < 0 or seg["length"] < 0 or seg["sample_start"] + seg["length"] > tokens:
            raise RowError(f"sample {rec['event_id']}: segment {seg} lies outside its {tokens} tokens")
        if seg["call_start"] < 0:
            raise RowError(f"sample {rec['event_id']}: segment {seg} has a negative call offset")
    row = {k: v for k, v in rec.items() if k != "segments" and k not in NOT_STORED}
    row["version_spans"] = span_tuples(rec.get("version_spans") or [])
    for f in SEGMENT_FIELDS:
        row[f"seg_{f}"] = [s[f] for s in rec["segments"]]
    # Derived for SQL (ClickHouse cannot cheaply sum packed float32): each segment's loss weight, and
    # the sample's total. The audit recomputes both from the bytes.
    weights = unpack_floats(rec["weights"]).astype(np.float64)
    row["seg_weight"] = segment_weight_sums(weights, rec["segments"])
    row["weight_total"] = float(weights.sum())
    # Stored in full here; the writer may replace token columns by references to their calls
    # (sinks/sample_refs.py), which these columns then describe.
    row.update(input_ref_call_ids=[], input_length=tokens, input_sha256="", logprobs_sha256="")
    return row


def segment_weight_sums(weights: npt.NDArray[np.float64], segments: list[Record]) -> list[float]:
    """Sum of per-token weights inside each segment (float64 accumulation)."""
    if not segments:
        return []
    csum = np.concatenate([[0.0], np.cumsum(weights)])
    return [float(csum[s["sample_start"] + s["length"]] - csum[s["sample_start"]]) for s in segments]


def dead_letter_row(rec: Record) -> Row:
    return _flat(rec, {"partition": "source_partition", "offset": "source_offset"})


ROW_BUILDERS: dict[str, Callable[[Record], Row]] = {
    "CallRecord": call_row,
    "CompletedRollout": rollout_row,
    "Sample": sample_row,
    "DeadLetter": dead_letter_row,
}


@dataclass(frozen=True)
class Source:
    """Where a record was read from (kept on the row for forensics)."""

    topic: str
    partition: int
    offset: int
    # The Kafka record timestamp (ms; -1: none): when the record was produced, or appended on a
    # LogAppendTime topic. Freshness views time each stage by it (issue 30).
    timestamp_ms: int = -1


def to_row(name: str, record: Record, source: Source | None = None) -> tuple[str, Row]:
    """(table, row) for a decoded record of schema ``name``."""
    try:
        table = TABLE_OF[name]
    except KeyError:
        raise RowError(f"no table for record type {name!r}") from None
    try:
        row = ROW_BUILDERS.get(name, _flat)(record)
    except KeyError as exc:
        raise RowError(f"{name} record lacks field {exc}") from exc
    row["content_hash"] = content_hash(name, record)
    if source is not None:
        row.update(src_topic=source.topic, src_partition=source.partition, src_offset=source.offset,
                   src_time_ms=source.timestamp_ms)
    return table, row


# ---- row -> record -------------------------------------------------------------------------------

METADATA_COLUMNS = frozenset({"content_hash", "src_topic", "src_partition", "src_offset", "src_time_ms", "ingested_at",
                              "event_time"})


def _schema_fields(name: str) -> list[str]:
    return [f["name"] for f in get_codec().store.schema(name).raw["fields"]]


def call_from_row(row: Row) -> Record:
    err = None
    if row["error_type"] is not None:
        err = {
            "type": row["error_type"],
            "message": row["error_message"] or "",
            "status_code": row["error_status_code"] or 0,
        }
    rec = {
        k: row[k]
        for k in (
            "event_id",
            "call_id",
            "rollout_id",
            "attempt_id",
            "call_index",
            "session_id",
            "protocol",
            "streamed",
            "status",
        )
    }
    rec["error"] = err
    rec["prompt"] = {
        "length": row["prompt_length"],
        "sha256": row["prompt_sha256"],
        "ids": row["prompt_ids"],
        "base_call_id": row["prompt_base_call_id"],
        "base_prefix_len": row["prompt_base_prefix_len"],
        "new_ids": row["prompt_new_ids"],
    }
    rec.update(
        output_ids=row["output_ids"],
        output_logprobs=row["output_logprobs"],
        logprob_kind=row["logprob_kind"],
        finish_reason=row["finish_reason"],
    )
    rec["versions"] = {k: row[k] for k in call_version_fields()}
    rec["sampling"] = {k: row[k] for k in ("temperature", "top_p", "top_k", "max_tokens", "seed")}
    rec["sampling"]["stop"] = list(row["stop"])
    rec["sampling"]["extra_json"] = row["sampling_extra_json"]
    rec.update(
        prefix_mode=row["prefix_mode"],
        spliced_outputs=row["spliced_outputs"],
        prefix_breaks=list(row["prefix_breaks"]),
    )
    rec["timings"] = {k: row[k] for k in ("received_at_us", "queue_ms", "first_token_ms", "total_ms")}
    rec.update(request_json=row["request_json"], response_json=row["response_json"], scripted=row["scripted"])
    rec.update(version_spans=span_records(row.get("version_spans")), release=release_from_columns(row))
    rec.update(subject=row.get("subject"), sealed=None)
    return rec


@dataclass(frozen=True)
class CallTokens:
    """A call's full prompt ids and its output bytes, as the calls table holds them."""

    prompt: IdArray
    output_ids: bytes
    output_logprobs: bytes


def rollout_from_row(row: Row, call_tokens: Callable[[str], CallTokens | None]) -> Record:
    """Rebuild a CompletedRollout; ``call_tokens(call_id)`` gives each call's tokens from the calls table.

    Every rebuilt array is checked against the hash the rollout row kept; a mismatch is a RowError.
    """
    rec = {
        k: _plain(row.get(k))
        for k in _schema_fields("CompletedRollout")
        if k not in ("calls", "env_events", "prefix_links")
    }
    calls = []
    for i, call_id in enumerate(row["c_call_id"]):
        tokens = call_tokens(call_id)
        if tokens is None:
            raise RowError(f"rollout {row['rollout_id']}: call {call_id} is not in the calls table")
        prompt = _prompt_as_recorded(tokens.prompt, row["c_prompt_base_call_id"][i], row["c_prompt_base_prefix_len"][i])
        if prompt["length"] != row["c_prompt_length"][i] or prompt["sha256"] != row["c_prompt_sha256"][i]:
            raise RowError(f"rollout {row['rollout_id']}: call {call_id} prompt differs from the call record")
        if (
            _sha(tokens.output_ids) != row["c_output_sha256"][i]
            or _sha(tokens.output_logprobs) != row["c_logprobs_sha256"][i]
        ):
            raise RowError(f"rollout {row['rollout_id']}: call {call_id} output differs from the call record")
        call = {f: row[f"c_{f}"][i] for f in ROLLOUT_CALL_FIELDS if f != "scripted"}
        scripted = row["c_scripted"]  # empty in rows stored before migration 0009: the schema's default
        call["scripted"] = bool(scripted[i]) if scripted else False
        spans = row.get("c_version_spans") or []  # empty in rows stored before migration 0014
        call["version_spans"] = span_records(spans[i]) if spans else []
        failures = row.get("c_parse_failures") or []  # empty in rows stored before migration 0019: not known
        call["parse_failures"] = failures[i] if failures else None
        call.update(prompt=prompt, output_ids=tokens.output_ids, output_logprobs=tokens.output_logprobs)
        calls.append(
            {
                k: call[k]
                for k in (
                    "call_id",
                    "call_index",
                    "status",
                    "policy_version",
                    "prompt",
                    "output_ids",
                    "output_logprobs",
                    "logprob_kind",
                    "finish_reason",
                    "tokenizer_fingerprint",
                    "chat_template_fingerprint",
                    "scripted",
                    "version_spans",
                    "parse_failures",
                )
            }
        )
    rec["calls"] = calls
    rec["env_events"] = [{f: row[f"e_{f}"][i] for f in ROLLOUT_ENV_FIELDS} for i in range(len(row["e_event_id"]))]
    rec["prefix_links"] = [
        {f: row[f"p_{f}"][i] for f in PREFIX_LINK_FIELDS} for i in range(len(row["p_from_call_index"]))
    ]
    return _reorder("CompletedRollout", rec)


def _prompt_as_recorded(full: IdArray, base_call_id: str | None, base_prefix_len: int) -> Record:
    packed = full.tobytes()
    if base_call_id is None:
        return {
            "length": len(full),
            "sha256": ids_digest(packed),
            "ids": packed,
            "base_call_id": None,
            "base_prefix_len": base_prefix_len,
            "new_ids": None,
        }
    return {
        "length": len(full),
        "sha256": ids_digest(packed),
        "ids": None,
        "base_call_id": base_call_id,
        "base_prefix_len": base_prefix_len,
        "new_ids": full[base_prefix_len:].tobytes(),
    }


def sample_from_row(row: Row) -> Record:
    if row.get("input_ref_call_ids") or row.get("logprobs_sha256"):
        # Never an empty column in place of tokens: rebuilding needs the calls (sinks/store.py does it).
        raise RowError(f"sample {row['event_id']}: token columns stored by reference to calls, not rebuilt")
    rec = {k: _plain(row.get(k)) for k in _schema_fields("Sample") if k not in ("segments", "version_spans")}
    rec["version_spans"] = span_records(row.get("version_spans"))
    rec["segments"] = [{f: row[f"seg_{f}"][i] for f in SEGMENT_FIELDS} for i in range(len(row["seg_call_id"]))]
    return _reorder("Sample", rec)


def dead_letter_from_row(row: Row) -> Record:
    renamed = {"source_partition": "partition", "source_offset": "offset"}
    rec = {renamed.get(k, k): v for k, v in row.items() if k not in METADATA_COLUMNS}
    return _reorder("DeadLetter", rec)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _reorder(name: str, rec: Record) -> Record:
    return {f: _plain(rec[f] if f not in NOT_STORED else None) for f in _schema_fields(name)}


def from_row(table: str, row: Row) -> Record:
    """The Avro record of a row from any table except rollouts (see ``rollout_from_row``)."""
    name = RECORD_OF[table]
    if table == "calls":
        return call_from_row(row)
    if table == "samples":
        return sample_from_row(row)
    if table == "dead_letters":
        return dead_letter_from_row(row)
    if table == "rollouts":
        raise RowError("rollout rows need their calls' tokens: use rollout_from_row(row, call_tokens)")
    return _reorder(name, {k: v for k, v in row.items() if k not in METADATA_COLUMNS})


def prompt_base_sequence(prompt: IdArray, output_ids: bytes) -> IdArray:
    """prompt ‖ output of a call: what a later delta-encoded prompt extends."""
    return np.concatenate([prompt, unpack_ids(output_ids)])
