"""Two gloo ranks on the real broker: rank 0 reads uneven partitions, every global step is split over both
ranks (one step leaves rank 1 nothing), each sample is trained exactly once (from the TrainerStep events),
offsets are committed after every rank's step; and the rank-aware sample stream other trainers use."""

from __future__ import annotations

import gc
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
import torch.multiprocessing as mp

from models.policy_store import PolicyStore
from schemas.codec import get_codec
from schemas.kafka import config as kafka_config
from testkit.samples import random_sequence, sample_record
from trainer_consumer.batching import BatchBuilder, FilterConfig
from trainer_consumer.dataset import SampleStream
from trainer_consumer.rank_stream import RankSampleStream
from trainer_consumer.rank_training import run_on_ranks
from trainer_consumer.ranks import RankGroup
from trainer_consumer.step_audit import exactly_once
from trainer_consumer.trainer import TrainOptions

from .helpers import VOCAB, make_tiny_model
from .test_kafka import _committed, _produce, _read_all


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_rank(rank: int, port: int, body: Callable[[RankGroup], None]) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    group = RankGroup.from_env(timeout_s=120)
    try:
        body(group)
    finally:
        group.close()


def _fork_two(body: Callable[[RankGroup], None]) -> None:
    # Forked: the children inherit torch and transformers already imported (seconds, not a minute).
    # Earlier tests' garbage may hold Kafka clients; collected in a forked child, their destructors join
    # librdkafka threads that do not exist there (seen: a hang, or SIGSEGV in the child's first GC).
    gc.collect()
    mp.start_processes(_as_rank, args=(_free_port(), body), nprocs=2, join=True, start_method="fork")


@pytest.fixture
def produced(tokentrail_settings, new_topic) -> tuple[str, list[dict[str, Any]]]:
    """A 3-partition samples topic with 10 samples on partitions 0 and 1 only (uneven; 2 stays empty)."""
    topic = new_topic(3)
    rng = np.random.default_rng(3)
    records = [sample_record([random_sequence(rng, VOCAB, int(rng.integers(4, 12)), int(rng.integers(2, 8)),
                                              f"k{i}")]) for i in range(10)]
    codec = get_codec()
    _produce(tokentrail_settings, topic,
             [(0 if i < 7 else 1, codec.encode("Sample", r)) for i, r in enumerate(records)])
    return topic, records


def test_two_ranks_train_every_sample_once_and_commit_after_both(
        kafka_bootstrap, tokentrail_settings, new_topic, tmp_path: Path, produced) -> None:
    settings = tokentrail_settings
    samples_topic, records = produced
    steps_topic, dead_topic = new_topic(1), new_topic(1)
    model_dir = tmp_path / "model"
    make_tiny_model().save_pretrained(model_dir)
    group_id = f"test-ranks-{uuid.uuid4().hex[:8]}"
    options = TrainOptions(until_idle=True, idle_timeout_s=2.0, batch_size=3, group_id=group_id, run_id="ranks",
                           model_dir=model_dir, checkpoint_dir=tmp_path / "policies", samples_topic=samples_topic,
                           steps_topic=steps_topic, dead_letter_topic=dead_topic, torch_threads=1)

    def body(group: RankGroup) -> None:
        summary = run_on_ranks(settings, options, group)
        if group.is_leader:
            assert summary is not None
            (tmp_path / "summary.json").write_bytes(orjson.dumps({"steps": summary.steps, "stopped": summary.stopped}))

    _fork_two(body)

    assert orjson.loads((tmp_path / "summary.json").read_bytes()) == {"steps": 4, "stopped": "idle"}
    events = _read_all(settings, steps_topic, expect=4)
    audit = exactly_once(events, [r["event_id"] for r in records])
    assert audit.ok and audit.samples_trained == 10 and audit.steps == 4 and audit.ranks == (2,)
    assert [len(e["sample_ids"]) for e in events] == [3, 3, 3, 1]
    assert set(audit.rank_samples) == {0, 1}
    for e in events:
        assert e["ranks"] == 2 and len(e["sample_ranks"]) == len(e["sample_ids"])
        assert sum(e["rank_tokens"]) == e["tokens"]
    assert events[-1]["rank_tokens"][1] == 0  # the one-sample step: rank 1 joined with nothing
    assert _committed(settings, group_id, samples_topic, 3) == {0: 7, 1: 3, 2: -1001}
    store = PolicyStore(tmp_path / "policies")
    assert store.latest_version() == 4
    # The published policy carries its step's event (re-emitted after a crash before the emit).
    assert store.info(4).metadata["step_event"]["event_id"] == events[-1]["event_id"]


def test_rank_sample_stream_hands_each_rank_a_share_and_commits_after_every_rank(
        kafka_bootstrap, tokentrail_settings, tmp_path: Path, produced) -> None:
    settings = tokentrail_settings
    topic, records = produced
    group_id = f"test-rank-stream-{uuid.uuid4().hex[:8]}"

    def body(group: RankGroup) -> None:
        source = None
        if group.is_leader:
            source = SampleStream(kafka_config.consumer_config(settings.kafka, group_id), topic,
                                  BatchBuilder(4, filters=FilterConfig().build()), current_version=lambda: 0)
        stream = RankSampleStream(group, source, idle_timeout_s=2.0, until_idle=True)
        seen: list[dict[str, Any]] = []
        for batch in stream:
            seen.append({"step": batch.step, "ids": [s.sample_id for s in batch.samples],
                         "all": list(batch.global_sample_ids), "denominator": batch.denominator,
                         "committed_before": source.committed() if source is not None else {}})
            stream.commit(batch)
        if source is not None:
            seen.append({"committed_after": source.committed()})
            source.close()
        (tmp_path / f"rank{group.rank}.json").write_bytes(orjson.dumps(seen, option=orjson.OPT_NON_STR_KEYS))

    _fork_two(body)

    rank0 = orjson.loads((tmp_path / "rank0.json").read_bytes())
    rank1 = orjson.loads((tmp_path / "rank1.json").read_bytes())
    assert rank0.pop()["committed_after"] == {"0": 7, "1": 3}
    assert [b["step"] for b in rank0] == [b["step"] for b in rank1] == [1, 2, 3]
    for b0, b1 in zip(rank0, rank1, strict=True):
        assert b0["all"] == b1["all"] and b0["denominator"] == b1["denominator"] > 0
        assert sorted(b0["ids"] + b1["ids"]) == sorted(b0["all"])  # disjoint shares covering the batch
    assert sorted(i for b in rank0 for i in b["all"]) == sorted(r["event_id"] for r in records)
    # Nothing of a batch is committed before every rank has committed it.
    assert [sum(b["committed_before"].values()) for b in rank0] == [0, 4, 8]
