from __future__ import annotations

import json

import numpy as np
import orjson

from schemas.tokens import pack_floats, pack_ids, pack_int32, pack_mask
from testkit.samples import random_sequence, sample_record
from trainer_consumer.batching import BatchBuilder, FilterConfig, batches_from_samples
from trainer_consumer.sample_view import check_sample

from .helpers import VOCAB, decode_round_trip


def _record(version: int, seed: int = 0, advantage: float | None = None, weight: float = 1.0) -> dict:
    rng = np.random.default_rng(seed)
    return sample_record([random_sequence(rng, VOCAB, 4, 3, f"r{seed}", advantage=advantage, weight=weight)],
                         policy_version=version)


def test_stale_samples_are_counted_not_silently_dropped() -> None:
    cfg = FilterConfig(max_staleness=2)
    builder: BatchBuilder[int] = BatchBuilder(batch_size=3, filters=cfg.build(), staleness=cfg.staleness())
    current = 10
    versions = [10, 7, 8, 5, 9, 8]  # lags 0, 3, 2, 5, 1, 2 -> two beyond the bound
    samples = [decode_round_trip(_record(v, seed=i)) for i, v in enumerate(versions)]
    reasons = [builder.add(s, i, current) for i, s in enumerate(samples)]
    assert reasons == [None, "stale", None, "stale", None, None]
    batch = builder.take()
    assert batch.stale_dropped_ids == [samples[1].sample_id, samples[3].sample_id]
    assert [s.policy_version_first for s in batch.samples] == [10, 8, 9, 8]
    assert batch.filtered == {"stale": 2}
    assert batch.positions == [0, 1, 2, 3, 4, 5]  # the stale ones are committed with the batch
    assert json.loads(batch.filtered_json()) == {"stale": 2}


def test_batches_close_at_batch_size_and_token_budget() -> None:
    samples = [(decode_round_trip(_record(0, seed=i)), i) for i in range(7)]
    by_count = list(batches_from_samples(samples, batch_size=3, current_version=0))
    assert [len(b.samples) for b in by_count] == [3, 3, 1]
    by_tokens = list(batches_from_samples(samples, batch_size=100, current_version=0, max_batch_tokens=14))
    assert [len(b.samples) for b in by_tokens] == [2, 2, 2, 1]


def test_optional_filters_each_count_their_reason() -> None:
    cfg = FilterConfig(max_staleness=100, max_tokens=8, drop_zero_advantage=True, kinds=("CALL",),
                       vocab_size=VOCAB)
    builder: BatchBuilder[int] = BatchBuilder(batch_size=10, filters=cfg.build())
    rng = np.random.default_rng(0)
    long_one = sample_record([random_sequence(rng, VOCAB, 5, 5, "long")])
    packed = sample_record([random_sequence(rng, VOCAB, 2, 2, "a"), random_sequence(rng, VOCAB, 1, 1, "b")])
    foreign = sample_record([random_sequence(rng, VOCAB, 3, 1, "f")])
    foreign["input_ids"] = pack_ids([1, 2, VOCAB, 3])  # an id the model has no embedding for
    inputs = [_record(0, 1), long_one, _record(0, 2, advantage=0.0), _record(0, 3, weight=0.0), packed,
              foreign]
    for i, rec in enumerate(inputs):
        builder.add(decode_round_trip(rec), i, 0)
    batch = builder.take()
    assert len(batch.samples) == 1
    assert batch.filtered == {"too_long": 1, "zero_advantage": 1, "zero_weight": 1, "kind:PACKED": 1,
                              "token_id_out_of_vocab": 1}


def test_malformed_samples_are_rejected_with_a_reason() -> None:
    base = _record(0)
    cases = {
        "malformed:loss_mask_length": {"loss_mask": pack_mask([0, 1])},
        "malformed:sequence_starts": {"sequence_starts": pack_int32([0, 9])},
        "malformed:loss_on_sequence_start": {"loss_mask": pack_mask([1, 0, 0, 0, 1, 1, 1])},
        "malformed:missing_rollout_logprob": {"rollout_logprobs": pack_floats([np.nan] * 7)},
        "malformed:negative_weight": {"weights": pack_floats([0, 0, 0, 0, -1, 1, 1])},
    }
    assert check_sample(decode_round_trip(base)) is None
    builder: BatchBuilder[int] = BatchBuilder(batch_size=10)
    for i, (reason, patch) in enumerate(cases.items()):
        sample = decode_round_trip({**base, **patch})
        assert check_sample(sample) == reason
        assert builder.add(sample, i, 0) == reason
    batch = builder.take()
    assert batch.samples == [] and sum(batch.filtered.values()) == len(cases)


def test_revoked_partitions_are_forgotten() -> None:
    builder: BatchBuilder[tuple[int, int]] = BatchBuilder(batch_size=10)
    for i in range(6):
        builder.add(decode_round_trip(_record(0, seed=i)), (i % 2, i), 0)
    builder.reject("decode_error:CorruptRecord", (1, 99))
    assert builder.retain(lambda pos: pos[0] == 0) == 4
    batch = builder.take()
    assert batch.positions == [(0, 0), (0, 2), (0, 4)] and len(batch.samples) == 3
    assert not batch.filtered
    assert orjson.loads(batch.filtered_json()) == {}


def test_a_sample_delivered_twice_is_trained_once() -> None:
    builder: BatchBuilder[int] = BatchBuilder(batch_size=2, dedupe_window=2)
    a, b, c, d = (decode_round_trip(_record(0, seed=i)) for i in range(4))
    assert [builder.add(s, i, 0) for i, s in enumerate([a, a, b])] == [None, "duplicate", None]
    first = builder.take()
    assert first.sample_ids == [a.sample_id, b.sample_id] and first.filtered == {"duplicate": 1}
    # Already trained: still a duplicate in a later batch, until it leaves the window.
    assert builder.add(b, 3, 0) == "duplicate"
    builder.add(c, 4, 0)
    builder.add(d, 5, 0)
    builder.take()  # the window (2) now holds c and d
    assert builder.add(a, 6, 0) is None
