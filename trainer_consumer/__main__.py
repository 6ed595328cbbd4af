"""``python -m trainer_consumer``: one rank of the trainer, as ``torchrun`` starts it.

    torchrun --nproc-per-node 2 --max-restarts 3 -m trainer_consumer --max-steps 100
    tokentrail train --nproc 2 ...        (the same, with every ``tokentrail train`` option)

Settings come from the ``TOKENTRAIL_*`` environment like the shell's; ``--options FILE`` takes the full
``TrainOptions`` as JSON (what ``tokentrail train --nproc`` writes), the flags below override it. Only
rank 0 prints progress (the other ranks print a line when they start and stop).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from trainer_consumer.rank_options import options_from_json
from trainer_consumer.rank_training import run_on_ranks
from trainer_consumer.ranks import RankGroup
from trainer_consumer.settings import TrainerRunSettings
from trainer_consumer.trainer import TrainOptions


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer_consumer", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--options", type=Path, default=None, help="TrainOptions as JSON (tokentrail train --nproc)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after N global steps")
    p.add_argument("--until-idle", action="store_true", help="stop when no sample arrives for --idle-timeout")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="S")
    p.add_argument("--batch-size", type=int, default=None, help="samples per global step (all ranks)")
    p.add_argument("--group-id", default=None)
    p.add_argument("--run-id", default=None)
    p.add_argument("--samples-topic", default=None)
    p.add_argument("--steps-topic", default=None)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--checkpoint-dir", type=Path, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch threads per rank")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options = options_from_json(args.options.read_bytes()) if args.options else TrainOptions()
    overrides = {"max_steps": args.max_steps, "idle_timeout_s": args.idle_timeout, "batch_size": args.batch_size,
                 "group_id": args.group_id, "run_id": args.run_id, "samples_topic": args.samples_topic,
                 "steps_topic": args.steps_topic, "model_dir": args.model_dir,
                 "checkpoint_dir": args.checkpoint_dir, "torch_threads": args.threads}
    options = dataclasses.replace(options, **{k: v for k, v in overrides.items() if v is not None})
    if args.until_idle:
        options = dataclasses.replace(options, until_idle=True)
    group = RankGroup.from_env()
    prefix = f"[rank {group.rank}] " if group.distributed else ""

    def progress(line: str) -> None:
        if group.is_leader or line.startswith("rank "):
            print(prefix + line, flush=True)

    try:
        summary = run_on_ranks(TrainerRunSettings(), options, group, progress=progress)
    finally:
        group.close()
    if summary is not None:
        print(f"{prefix}trained {summary.steps} steps on {summary.samples} samples ({summary.tokens:,} tokens) "
              f"on {group.world_size} rank(s) in {summary.seconds:.1f} s; stopped: {summary.stopped or 'interrupted'}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
