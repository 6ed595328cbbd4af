"""Synthetic value distributions for storage studies, and the storage benchmark's per-length ratios, in chDB."""

from __future__ import annotations

import numpy as np
from clickhouse_connect.driver.client import Client

from bench.sink import encoded_events, stored_ratios
from schemas.tokens import unpack_ids
from sinks.client import connect
from sinks.store import load_records, load_rollouts, write_records
from sinks.synthetic import VOCAB, GroupSpec, synthetic_group


def test_default_distributions_are_the_uniform_draws_other_tests_rely_on() -> None:
    spec = GroupSpec(group_index=3)
    first = synthetic_group(spec).of("CallRecord")[0]
    rng = np.random.default_rng(spec.seed * 100_003 + spec.group_index)
    assert np.array_equal(unpack_ids(first["prompt"]["ids"]), rng.integers(0, VOCAB, 64, dtype=np.uint32))
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


def test_stored_share_of_full_prompts_falls_with_rollout_length(chdb_dsn: str) -> None:
    ratios = {}
    for turns in (2, 6):
        client = connect(dsn=chdb_dsn, database=f"t_bench_ratios_{turns}", create_database=True)
        try:
            calls = encoded_events(1, turns, 400, 100, 30, only="CallRecord")
            ratios[turns] = stored_ratios(client, calls)
        finally:
            client.command(f"DROP DATABASE IF EXISTS {client.database}")
    for kind in ("same_design", "bytes_layout", "uncompressed"):
        assert 0 < ratios[6][kind] < ratios[2][kind] < 1, (kind, ratios)
