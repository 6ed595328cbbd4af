"""Synthetic value distributions for storage studies, and the storage benchmark's per-length ratios, in chDB."""

from __future__ import annotations

import numpy as np
from clickhouse_connect.driver.client import Client

from bench.sink import encoded_events, stored_ratios
from schemas.tokens import unpack_ids
from sinks.store import load_records, load_rollouts, write_records
from testkit.storage_records import VOCAB, GroupSpec, synthetic_group
from tests.sinks.conftest import fresh_database


def test_default_distributions_are_the_uniform_draws_other_tests_rely_on() -> None:
    spec = GroupSpec(group_index=3)
    first = synthetic_group(spec).of("CallRecord")[0]
    rng = np.random.default_rng(spec.seed * 100_003 + spec.group_index)
    distinct_prompt = rng.integers(0, VOCAB, 64, dtype=np.uint32)
    task_prompt = np.random.default_rng([spec.seed, spec.group_index, 7]).integers(0, VOCAB, 64, dtype=np.uint32)
    assert np.array_equal(unpack_ids(first["prompt"]["ids"]), task_prompt)
    distinct = synthetic_group(GroupSpec(group_index=3, task_prompt="distinct")).of("CallRecord")[0]
    assert np.array_equal(unpack_ids(distinct["prompt"]["ids"]), distinct_prompt)
    assert distinct["output_ids"] == first["output_ids"]  # the task prompt leaves every later draw alone
    assert np.array_equal(unpack_ids(first["output_ids"]), rng.integers(0, VOCAB, 32, dtype=np.uint32))
    expected = -rng.random(32, dtype=np.float32)
    assert np.array_equal(np.frombuffer(first["output_logprobs"], "<f4"), expected)


def test_model_like_distributions_round_trip_exactly(ch: Client) -> None:
    g = synthetic_group(GroupSpec(rollouts=2, turns=3, output_tokens=4000, ids="zipf", logprobs="model"))
    calls = g.of("CallRecord")
    lp = np.concatenate([np.frombuffer(c["output_logprobs"], "<f4") for c in calls])
    ids = np.concatenate([unpack_ids(c["output_ids"]) for c in calls])
    assert lp.max() <= 0 and np.median(lp) > -0.05 and lp.min() < -5  # mostly near-certain, a long tail
    assert ids.max() < VOCAB and np.median(ids) < 1000  # frequent (low) ids dominate
    write_records(ch, g.events)
    assert load_records(ch, "calls", order_by="event_id") == sorted(calls, key=lambda c: c["event_id"])
    assert sorted(load_rollouts(ch), key=lambda r: r["event_id"]) == sorted(
        g.of("CompletedRollout"), key=lambda r: r["event_id"]
    )


def _ratios(dsn: str, template: str, bodies: str, turns: int) -> dict[str, float]:
    # A migrated database (the fixtures' copy of the session's template): stored_ratios' own migrate() finds
    # every migration applied.
    client = fresh_database(dsn, f"bench_ratios_{bodies}_{turns}", template)
    try:
        return stored_ratios(client, encoded_events(1, turns, 2000, 300, 50, only="CallRecord", bodies=bodies))
    finally:
        client.command(f"DROP DATABASE IF EXISTS {client.database}")


def test_stored_share_of_full_prompts_falls_with_rollout_length(chdb_dsn: str, migrated_template: str) -> None:
    tiny = {turns: _ratios(chdb_dsn, migrated_template, "tiny", turns) for turns in (2, 6)}
    for kind in ("same_design", "prompt_columns", "bytes_layout", "uncompressed"):
        assert 0 < tiny[6][kind] < tiny[2][kind], (kind, tiny)
        assert tiny[6][kind] < 0.9, (kind, tiny)
    # At 2 calls a rollout the released layout's ZSTD finds the one repeat itself: about even.
    assert max(r for k, r in tiny[2].items() if k != "bytes_layout") < 1 and tiny[2]["bytes_layout"] < 1.05, tiny
    # With the conversation in every request body, the bodies' deltas keep the fall (the released byte
    # layout's ZSTD finds small repeated bodies itself, so only the same design is compared here).
    chat = {turns: _ratios(chdb_dsn, migrated_template, "chat", turns) for turns in (2, 6)}
    for kind in ("same_design", "uncompressed"):
        assert 0 < chat[6][kind] < chat[2][kind] < 1, (kind, chat)
