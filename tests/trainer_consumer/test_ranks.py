"""Several ranks train what one process trains: the same samples, 1 rank and 2 gloo ranks (spawned
processes, the tiny model), give the same weights after K steps, also when a step has fewer samples
than ranks (a rank joins with nothing) and when micro-batches split a rank's share."""

from __future__ import annotations

import gc
import os
import socket
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from testkit.samples import random_sequence, sample_record
from trainer_consumer.learner import Learner, LearnerConfig
from trainer_consumer.losses import loss_denominator
from trainer_consumer.rank_learner import RankLearner
from trainer_consumer.ranks import RankGroup
from trainer_consumer.sample_view import TrainSample
from trainer_consumer.sharding import shard_samples, step_shares

from .helpers import VOCAB, decode_round_trip, make_tiny_model

STEP_SIZES = (5, 1, 4)  # the middle step leaves rank 1 with nothing
CFG = LearnerConfig(learning_rate=1e-2, micro_batch_tokens=24)


def _steps() -> list[list[TrainSample]]:
    rng = np.random.default_rng(7)
    out, n = [], 0
    for size in STEP_SIZES:
        step = []
        for _ in range(size):
            seq = random_sequence(rng, VOCAB, int(rng.integers(3, 12)), int(rng.integers(2, 10)), f"r{n}",
                                  weight=float(rng.uniform(0.5, 2.0)))
            step.append(decode_round_trip(sample_record([seq])))
            n += 1
        out.append(step)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    group = RankGroup.from_env(timeout_s=60)
    try:
        learner = RankLearner(make_tiny_model(), CFG, group)
        wrapper = weakref.ref(learner.forward_model)
        if group.is_leader:
            results = [learner.step(samples) for samples in _steps()]
            learner.stop_followers()
            torch.save({"state": learner.model.state_dict(),
                        "results": [(r.ranks, r.samples, r.tokens, r.rank_tokens, dict(r.sample_ranks), r.stats.loss)
                                    for r in results]}, Path(out_dir) / "rank0.pt")
        else:
            torch.save({"followed": learner.follow(), "state": learner.model.state_dict()},
                       Path(out_dir) / f"rank{rank}.pt")
    finally:
        group.close()
    # The DDP wrapper (its reducer holds the gloo group) went before the group: see RankGroup.close.
    assert wrapper() is None and learner.forward_model is learner.model


def test_two_gloo_ranks_train_the_weights_one_process_trains(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    reference = make_tiny_model().state_dict()  # also imports the model's transformers modules, once
    # Forked, not spawned: the children start with torch and the model's modules already imported
    # (seconds instead of a minute on a loaded host). Collected first, so no child frees the parent's
    # garbage (torch objects among it) in the middle of its work.
    gc.collect()
    mp.start_processes(_rank_main, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    single = Learner(make_tiny_model(), CFG)
    losses = [single.step(samples).stats.loss for samples in _steps()]
    rank0: dict[str, Any] = torch.load(tmp_path / "rank0.pt", weights_only=False)
    rank1: dict[str, Any] = torch.load(tmp_path / "rank1.pt", weights_only=False)

    assert rank1["followed"] == len(STEP_SIZES)
    moved = 0.0
    for name, weight in single.model.state_dict().items():
        # Float tolerance: the sum over ranks adds the micro-batch gradients in another order.
        torch.testing.assert_close(rank0["state"][name], weight, rtol=1e-4, atol=1e-5)
        # The replicas are identical (same summed gradient, same AdamW), bit for bit.
        assert torch.equal(rank0["state"][name], rank1["state"][name])
        moved = max(moved, float((weight - reference[name]).abs().max()))
    assert moved > 1e-3  # the steps did change the weights, so the comparison means something
    for (ranks, samples, tokens, rank_tokens, ranks_of, loss), expected_loss, step in zip(
            rank0["results"], losses, _steps(), strict=True):
        assert ranks == 2
        assert samples == len(step)
        assert tokens == sum(rank_tokens) == sum(s.num_tokens for s in step)
        assert sorted(ranks_of) == sorted(s.sample_id for s in step)
        assert loss == pytest.approx(expected_loss, rel=1e-5, abs=1e-7)
    assert rank0["results"][1][3][1] == 0  # the one-sample step: rank 1 joined with nothing


def _resync_main(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Rank 0 replaces its weights between steps (as a rollback's resume does); every rank takes them."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    group = RankGroup.from_env(timeout_s=60)
    try:
        learner = RankLearner(make_tiny_model(), CFG, group)
        wrapper = weakref.ref(learner.forward_model)
        if group.is_leader:
            steps = _steps()
            learner.step(steps[0])
            learner.model.load_state_dict(make_tiny_model(seed=5).state_dict())
            learner.optimizer.state.clear()
            learner.weights_replaced()
            learner.step(steps[2])
            learner.stop_followers()
        else:
            learner.follow()
        torch.save(learner.model.state_dict(), Path(out_dir) / f"resync{rank}.pt")
    finally:
        group.close()
    assert wrapper() is None and learner.forward_model is learner.model  # as in _rank_main


def test_weights_replaced_on_rank_0_reach_every_rank_before_the_next_step(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    make_tiny_model()
    gc.collect()  # as above
    mp.start_processes(_resync_main, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    single = Learner(make_tiny_model(seed=5), CFG)  # the replaced weights, fresh moments, then the step
    single.step(_steps()[2])
    rank0, rank1 = (torch.load(tmp_path / f"resync{r}.pt") for r in (0, 1))
    for name, weight in single.model.state_dict().items():
        assert torch.equal(rank0[name], rank1[name])
        torch.testing.assert_close(rank0[name], weight, rtol=1e-4, atol=1e-5)


def test_shards_balance_tokens_and_cover_every_sample_once(make_samples) -> None:
    samples = make_samples(7, lengths=[(10, 30), (3, 2), (4, 4), (20, 20), (2, 3), (5, 5), (6, 6)])
    shares = shard_samples(samples, 3)
    assert sorted(s.sample_id for share in shares for s in share) == sorted(s.sample_id for s in samples)
    loads = [sum(s.num_tokens for s in share) for share in shares]
    assert max(loads) - min(loads) <= max(s.num_tokens for s in samples)
    assert loads == [40, 40, 40]  # 40 | 40 | 12+10+8+5+5
    order = {s.sample_id: i for i, s in enumerate(samples)}
    for share in shares:  # each share keeps the batch's order
        assert [order[s.sample_id] for s in share] == sorted(order[s.sample_id] for s in share)
    assert shard_samples(samples[:1], 3)[1:] == [[], []]
    shares_again = step_shares(1, samples, 3, loss_denominator(samples))
    assert [[s.sample_id for s in sh.samples] for sh in shares_again] == [[s.sample_id for s in sh] for sh in shares]
    assert {sh.denominator for sh in shares_again} == {loss_denominator(samples)}


def test_train_options_travel_to_the_ranks_as_json(tmp_path: Path) -> None:
    from trainer_consumer.batching import FilterConfig
    from trainer_consumer.losses import LossConfig
    from trainer_consumer.rank_launch import torchrun_command, torchrun_env
    from trainer_consumer.rank_options import OPTIONS_ENV, options_from_json, options_to_json
    from trainer_consumer.trainer import TrainOptions

    options = TrainOptions(max_steps=7, batch_size=32, model_dir=tmp_path / "m", group_id="g",
                           filters=FilterConfig(max_staleness=2, stale_rule="mask", kinds=("CALL",)),
                           learner=LearnerConfig(layout="packed", betas=(0.8, 0.9),
                                                 loss=LossConfig(importance_sampling="tis", clip_high=0.28)))
    assert options_from_json(options_to_json(options)) == options
    assert options_from_json(options_to_json(TrainOptions())) == TrainOptions()
    command = torchrun_command(4, max_restarts=3)
    assert command[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "--max-restarts=3",
                           "-m", "trainer_consumer"]
    assert torchrun_env(tmp_path / "o.json")[OPTIONS_ENV] == str(tmp_path / "o.json")
