"""The loop's bookkeeping with an in-memory batch source and event list (Kafka: test_trainer_kafka)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from models.policy_store import PolicyStore
from schemas.codec import get_codec
from testkit.samples import random_sequence, sample_record
from trainer_consumer.batching import Batch, FilterConfig, batches_from_samples
from trainer_consumer.learner import Learner, LearnerConfig
from trainer_consumer.policy import StorePublisher
from trainer_consumer.trainer import TrainerState, TrainingLoop

from .helpers import VOCAB, decode_round_trip, make_tiny_model


class ListSource:
    def __init__(self, batches: list[Batch[Any]]) -> None:
        self.batches = list(batches)
        self.committed: list[list[Any]] = []

    def next_batch(self, idle_timeout_s: float, flush_partial: bool) -> Batch[Any] | None:
        return self.batches.pop(0) if self.batches else None

    def commit(self, batch: Batch[Any]) -> None:
        self.committed.append(list(batch.positions))

    def checkpoint(self, batch: Batch[Any]) -> int:
        return max(batch.positions) + 1


class ListSink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def emit_step(self, record: dict[str, Any]) -> None:
        get_codec().encode("TrainerStep", record)  # must satisfy the contract
        self.records.append(record)


def _samples(versions: list[int]) -> list:
    rng = np.random.default_rng(0)
    return [decode_round_trip(sample_record([random_sequence(rng, VOCAB, 5, 3, f"r{i}")], policy_version=v))
            for i, v in enumerate(versions)]


def test_publishes_every_n_steps_and_records_filtered_only_batches(tmp_path) -> None:
    samples = _samples([5, 5, 0, 5, 5, 0, 5, 5])
    batches = list(batches_from_samples(zip(samples, range(8), strict=True), batch_size=2, current_version=5,
                                        staleness=FilterConfig(max_staleness=2).staleness()))
    assert [len(b.samples) for b in batches] == [2, 2, 2]  # each stale one rides with the next batch
    stale_only = Batch(samples=[], filtered=Counter({"stale": 3}), positions=[8, 9, 10])
    source, sink = ListSource([*batches, stale_only]), ListSink()
    store = PolicyStore(tmp_path / "policies")
    lines: list[str] = []
    loop = TrainingLoop(Learner(make_tiny_model(), LearnerConfig()), source, sink, StorePublisher(store),
                        run_id="run-x", steps_per_version=2, state=TrainerState(step=0, version=5),
                        progress=lines.append)
    summary = loop.run(until_idle=True)

    assert summary.steps == 3 and summary.stopped == "idle"
    assert summary.versions_published == [6] and store.latest_version() == 6
    assert store.info(6).metadata == {"run_id": "run-x", "step": 2, "consumed": 5}
    assert [(r["step"], r["policy_version_before"], r["policy_version_after"]) for r in sink.records] == [
        (1, 5, 5), (2, 5, 6), (3, 6, 6), (3, 6, 6)]
    last = sink.records[-1]
    assert last["sample_ids"] == [] and last["tokens"] == 0 and last["filtered_json"] == '{"stale":3}'
    assert [r["filtered_json"] for r in sink.records[:3]] == ["{}", '{"stale":1}', '{"stale":1}']
    assert source.committed == [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9, 10]]
    assert len({r["event_id"] for r in sink.records}) == 4
    assert "no trainable samples" in lines[-1]
    # Without a behaviour scorer only the step's own forward compares logprobs, and only while the weights
    # are the samples' version: step 1 (v5 weights, v5 samples); step 2's weights carry step 1's unpublished
    # update and step 3's are v6.
    assert [r["mismatch_tokens"] for r in sink.records] == [6, 0, 0, 0]


def test_max_steps_stops_the_loop_without_reading_further() -> None:
    samples = _samples([0] * 6)
    batches = list(batches_from_samples(zip(samples, range(6), strict=True), batch_size=2, current_version=0))
    source, sink = ListSource(batches), ListSink()
    loop = TrainingLoop(Learner(make_tiny_model(), LearnerConfig()), source, sink, None, run_id="r")
    summary = loop.run(max_steps=2)
    assert summary.steps == 2 and summary.stopped == "max_steps"
    assert len(source.batches) == 1 and len(source.committed) == 2
    assert summary.versions_published == []  # no publisher: weights stay in memory
