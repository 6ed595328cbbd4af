"""Pure record <-> row mapping (no database)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from schemas.codec import get_codec
from schemas.examples import example_record
from schemas.tokens import pack_floats, pack_ids, pack_mask, unpack_ids
from sinks.rows import (
    BINARY_COLUMNS,
    RECORD_OF,
    TABLE_OF,
    CallTokens,
    RowError,
    Source,
    content_hash,
    from_row,
    rollout_from_row,
    to_row,
)
from testkit.storage_records import GroupSpec, synthetic_group

FLAT_NAMES = sorted(set(TABLE_OF) - {"CompletedRollout"})


def test_every_schema_has_a_table() -> None:
    # Data keys are never copied to ClickHouse (a copy would outlive a forget): the key topic is not sunk.
    assert set(TABLE_OF) == set(get_codec().store.current) - {"SubjectKey"}
    assert set(RECORD_OF) == set(TABLE_OF.values())


@pytest.mark.parametrize("name", FLAT_NAMES)
def test_row_round_trip(name: str) -> None:
    record = example_record(get_codec().store.schema(name).raw)
    if name == "Sample":  # the generic example's arrays disagree in length; make them one 4-token sample
        record["loss_mask"] = pack_mask([0, 1, 1, 1])
        record["segments"][0].update(sample_start=0, call_start=0, length=4)
    if "sealed" in record:  # ClickHouse keeps opened content, never the envelope
        record["sealed"] = None
    table, row = to_row(name, record, Source("t", 3, 42))
    assert "sealed" not in row
    assert table == TABLE_OF[name]
    assert (row["src_topic"], row["src_partition"], row["src_offset"]) == ("t", 3, 42)
    assert len(row["content_hash"]) == 64
    for column in BINARY_COLUMNS.get(table, ()):
        assert row[column] is None or isinstance(row[column], bytes), column
    assert from_row(table, row) == record


def rollout_and_calls() -> tuple[dict, dict[str, CallTokens]]:
    g = synthetic_group(GroupSpec(rollouts=1, turns=3))
    rollout = g.of("CompletedRollout")[0]
    calls = {}
    prev = None
    for call in g.of("CallRecord"):
        prompt = call["prompt"]
        if prompt["ids"] is not None:
            full = unpack_ids(prompt["ids"])
        else:
            full = np.concatenate([prev[: prompt["base_prefix_len"]], unpack_ids(prompt["new_ids"])])
        calls[call["call_id"]] = CallTokens(full, call["output_ids"], call["output_logprobs"])
        prev = np.concatenate([full, unpack_ids(call["output_ids"])])
    return rollout, calls


def test_rollout_row_drops_token_bytes_and_rebuilds_exactly() -> None:
    rollout, calls = rollout_and_calls()
    table, row = to_row("CompletedRollout", rollout)
    assert table == "rollouts"
    assert not any(isinstance(v, bytes) for v in row.values())
    assert row["c_output_tokens"] == [32, 32, 32]
    assert rollout_from_row(row, calls.get) == rollout


def test_rollout_rebuild_refuses_tokens_that_differ_from_its_hashes() -> None:
    rollout, calls = rollout_and_calls()
    _, row = to_row("CompletedRollout", rollout)
    first = rollout["call_ids"][0]
    out = unpack_ids(calls[first].output_ids).copy()
    out[0] += 1
    calls[first] = CallTokens(calls[first].prompt, pack_ids(out), calls[first].output_logprobs)
    with pytest.raises(RowError, match="output differs"):
        rollout_from_row(row, calls.get)
    with pytest.raises(RowError, match="not in the calls table"):
        rollout_from_row(row, lambda _cid: None)


def test_sample_row_rejects_inconsistent_arrays_and_derives_weights() -> None:
    g = synthetic_group(GroupSpec(rollouts=2, turns=2, pack=True))
    packed = next(s for s in g.of("Sample") if s["kind"] == "PACKED")
    _, row = to_row("Sample", packed)
    weights = np.frombuffer(packed["weights"], "<f4").astype(np.float64)
    assert row["weight_total"] == pytest.approx(weights.sum())
    assert sum(row["seg_weight"]) == pytest.approx(2.0)  # two rollouts of weight 1.0 each
    bad = copy.deepcopy(packed)
    bad["loss_mask"] = bad["loss_mask"][:-1]
    with pytest.raises(RowError, match="loss_mask"):
        to_row("Sample", bad)
    bad = copy.deepcopy(packed)
    bad["segments"][-1]["length"] += 1
    with pytest.raises(RowError, match="outside"):
        to_row("Sample", bad)
    bad = copy.deepcopy(packed)
    bad["weights"] = pack_floats(np.zeros(3))
    with pytest.raises(RowError, match="weights"):
        to_row("Sample", bad)


def test_content_hash_sees_content_not_write_time() -> None:
    score = synthetic_group(GroupSpec(rollouts=1)).of("Score")[0]
    later = {**score, "created_at_us": score["created_at_us"] + 10**6, "duration_ms": 99.0}
    edited = {**score, "raw_json": '{"correct":true,"edited":1}'}
    assert content_hash("Score", later) == content_hash("Score", score)
    assert content_hash("Score", edited) != content_hash("Score", score)


def test_unknown_record_type_is_a_row_error() -> None:
    with pytest.raises(RowError, match="no table"):
        to_row("Nope", {})
    with pytest.raises(RowError, match="rollout_from_row"):
        from_row("rollouts", {})
