"""TrainerStep v4 in ClickHouse (migration 0016): the ranks of a global step, each sample's rank and each
rank's tokens are stored and read back with the record; one-process steps keep reading as one rank."""

from __future__ import annotations

from collections import Counter

import numpy as np
from clickhouse_connect.driver.client import Client

from schemas.codec import get_codec
from sinks.store import load_records, write_records
from testkit.samples import random_sequence, sample_record
from trainer_consumer.batching import Batch
from trainer_consumer.events import trainer_step_record
from trainer_consumer.learner import StepResult
from trainer_consumer.losses import LossStats
from trainer_consumer.sample_view import sample_from_record


def _record(step: int, ranks: int) -> dict:
    rng = np.random.default_rng(step)
    samples = [sample_from_record(sample_record([random_sequence(rng, 50, 4, 3, f"r{step}-{i}")])) for i in range(3)]
    by_rank = {s.sample_id: i % ranks for i, s in enumerate(samples)}
    result = StepResult(stats=LossStats(tokens=9), grad_norm=1.0, samples=3, tokens=21, micro_batches=1,
                        seconds=0.1, ranks=ranks, rank_tokens=(14, 7) if ranks == 2 else (),
                        sample_ranks=by_rank if ranks > 1 else {})
    record = trainer_step_record("run-ranks", step, step - 1, step, Batch(samples, Counter(), [step]), result,
                                 ranks=ranks)
    codec = get_codec()
    return codec.decode(codec.encode("TrainerStep", record), expect="TrainerStep")[1]


def test_rank_fields_are_stored_and_read_back(ch: Client) -> None:
    two, one = _record(1, 2), _record(2, 1)
    write_records(ch, [("TrainerStep", two), ("TrainerStep", one)])
    stored = ch.query("SELECT step, ranks, sample_ranks, rank_tokens FROM trainer_steps FINAL "
                      "ORDER BY step").result_rows
    assert stored == [(1, 2, [0, 1, 0], [14, 7]), (2, 1, [0, 0, 0], [21])]
    assert sorted(load_records(ch, "trainer_steps"), key=lambda r: r["step"]) == [two, one]
