"""The trainer on several ranks: rank 0 reads, trains its share, publishes, emits and commits; every other
rank trains the shares rank 0 hands it. ``run_on_ranks`` is what ``python -m trainer_consumer`` runs under
``torchrun`` (and ``tokentrail train --nproc N`` launches).

Exactly once per global step: one reader (rank 0, one consumer in the group) cuts each global batch, so a
sample belongs to exactly one step and one rank's share; a rank with nothing joins with zero; the offsets
are committed by rank 0 only after the all-gather that follows every rank's optimizer step. A dead rank
makes ``torchrun`` stop and restart the whole group: every rank resumes from the last published policy,
rank 0 from the committed offsets (or the offsets stored with that policy, when they are ahead).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from trainer_consumer.ranks import RankGroup
from trainer_consumer.trainer import Progress, RunSummary, TrainOptions, _quiet, learner_config, run_training

if TYPE_CHECKING:
    from trainer_consumer.settings import TrainerStackSettings


def follow_steps(settings: TrainerStackSettings, options: TrainOptions, group: RankGroup,
                 progress: Progress = _quiet) -> int:
    """A rank other than 0: the model (rank 0's weights arrive with DDP's first broadcast), then every
    step rank 0 hands out until it stops. Returns the steps taken."""
    from models.policy_store import PolicyStore
    from trainer_consumer.policy import load_policy
    from trainer_consumer.rank_learner import RankLearner

    if options.torch_threads:
        import torch

        torch.set_num_threads(options.torch_threads)
    store = PolicyStore(options.checkpoint_dir or settings.trainer.checkpoint_dir)
    run_id = options.run_id or options.group_id or settings.trainer.group_id
    policy = load_policy(options.model_dir or settings.model.dir, store, run_id, build_if_missing=False)
    learner = RankLearner(policy.model, learner_config(settings, options), group, pad_id=policy.pad_id)
    progress(f"rank {group.rank}/{group.world_size} ({group.backend}, {group.device}) following rank 0")
    steps = learner.follow()
    progress(f"rank {group.rank}: {steps} steps")
    return steps


def run_on_ranks(settings: TrainerStackSettings, options: TrainOptions, group: RankGroup,
                 progress: Progress = _quiet) -> RunSummary | None:
    """This process's part of a multi-rank run (rank 0's summary; None on other ranks)."""
    from models.reference.build import build_model

    model_dir = options.model_dir or settings.model.dir
    if group.is_leader and not (model_dir / "config.json").is_file():
        build_model(model_dir, progress=progress)
    group.barrier()  # the other ranks load the model rank 0 may just have built
    if group.is_leader:
        return run_training(settings, options, progress=progress, group=group)
    follow_steps(settings, options, group, progress=progress)
    return None


def run_ranks_main(settings: TrainerStackSettings, options: TrainOptions) -> int:
    """One rank's process, start to end (``python -m trainer_consumer``; ``tokentrail train`` under torchrun):
    joins the group torchrun describes, runs its part, prints rank 0's progress and summary."""
    group = RankGroup.from_env()
    prefix = f"[rank {group.rank}] " if group.distributed else ""

    def progress(line: str) -> None:
        if group.is_leader or line.startswith("rank "):
            print(prefix + line, flush=True)

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart:
        progress(f"rank {group.rank}: torchrun restart {restart}: resuming from the last published policy "
                 "and the committed offsets")

    try:
        summary = run_on_ranks(settings, options, group, progress=progress)
    finally:
        group.close()
    if summary is not None:
        print(f"{prefix}trained {summary.steps} steps on {summary.samples} samples ({summary.tokens:,} tokens) "
              f"on {group.world_size} rank(s) in {summary.seconds:.1f} s; stopped: {summary.stopped or 'interrupted'}",
              flush=True)
    return 0
