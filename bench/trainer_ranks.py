"""The trainer's global step on several gloo ranks (forked processes on this host), for bench.trainer.

Each rank is a DDP replica with ``threads`` torch threads; rank 0 hands out the step's samples
(``RankLearner.step``), the others follow. Timed: the best of ``repeat`` global steps after a warm-up."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import orjson


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, ranks: int, port: int, model_dir: str, samples: list[Any], repeat: int, threads: int,
          out: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from bench.common import best_time
    from trainer_consumer.learner import LearnerConfig
    from trainer_consumer.rank_learner import RankLearner
    from trainer_consumer.ranks import RankGroup

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(threads)
    group = RankGroup.from_env(timeout_s=600)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        learner = RankLearner(model, LearnerConfig(micro_batch_tokens=None), group)
        if group.is_leader:
            first = learner.step(samples)  # warm-up: allocator, optimizer state
            seconds = best_time(lambda: learner.step(samples), repeat=repeat)
            learner.stop_followers()
            Path(out).write_bytes(orjson.dumps({"seconds": seconds, "rank_tokens": list(first.rank_tokens)}))
        else:
            learner.follow()
    finally:
        group.close()


def ranked_step(ranks: int, model_dir: Path, samples: list[Any], repeat: int, threads: int) -> dict[str, Any]:
    """Best seconds of one global step on ``ranks`` forked gloo ranks, and each rank's tokens."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
        out = Path(tmp) / "rank0.json"
        mp.start_processes(_rank, args=(ranks, _free_port(), str(model_dir), samples, repeat, threads, str(out)),
                           nprocs=ranks, join=True, start_method="fork")
        return orjson.loads(out.read_bytes())  # type: ignore[no-any-return]
