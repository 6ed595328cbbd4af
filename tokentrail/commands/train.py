"""``tokentrail train``: the trainer consumer on the samples topic."""

from __future__ import annotations

import argparse
from pathlib import Path

from tokentrail.errors import CliError
from tokentrail.settings import get_settings
from trainer_consumer.batching import FilterConfig
from trainer_consumer.learner import LearnerConfig
from trainer_consumer.losses import LossConfig
from trainer_consumer.settings import resolve_importance_sampling

_EPILOG = """\
Each step prints: step number, policy version (v1->v2 when it published one), samples and tokens,
loss, mean importance ratio, clip fraction, k1 KL estimate (rollout - current logprob), gradient
norm, seconds, and how many samples were filtered by reason. Offsets are committed after each step.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="train on the samples topic (PPO/GRPO reference loss), publishing policy versions",
        description="Consume samples, take optimizer steps on the reference model, emit a TrainerStep "
                    "per step to the trainer-steps topic and publish new policy versions.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run = p.add_argument_group("running")
    run.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps")
    run.add_argument("--until-idle", action="store_true",
                     help="train on what is there (last batch may be partial), stop when no sample arrives "
                          "for --idle-timeout seconds")
    run.add_argument("--flush-partial", action="store_true",
                     help="keep running, but train on a partial batch whenever no sample arrives for "
                          "--idle-timeout seconds (drains the tail of a workload)")
    run.add_argument("--idle-timeout", type=float, default=5.0, metavar="S",
                     help="seconds without a new sample that count as idle (default 5)")
    run.add_argument("--run-id", default=None, help="run id in TrainerStep events (default: the group id)")
    run.add_argument("--group-id", default=None, help="consumer group (default: settings trainer.group_id)")
    run.add_argument("--model-dir", type=Path, default=None, help="base model (default: settings model.dir)")
    run.add_argument("--checkpoint-dir", type=Path, default=None,
                     help="policy store (default: settings trainer.checkpoint_dir)")
    run.add_argument("--steps-per-version", type=int, default=None,
                     help="publish a policy version every N steps (default: settings)")
    run.add_argument("--threads", type=int, default=None,
                     help="torch threads (default: all cores; 1 is faster on a host shared with the "
                          "gateway and processors)")
    run.add_argument("--follow-releases", action="store_true",
                     help="follow the release decisions of settings release.model (else model.name): a rollback "
                          "resumes training from the last good version (docs/release.md)")
    data = p.add_argument_group("batches and filters")
    data.add_argument("--batch-size", type=int, default=8, help="samples per optimizer step (default 8)")
    data.add_argument("--max-batch-tokens", type=int, default=None, help="also close a batch at N tokens")
    data.add_argument("--max-staleness", type=int, default=None,
                      help="bound: loss tokens more than N policy versions old are stale (default: settings)")
    data.add_argument("--stale-rule", choices=("drop", "mask"), default=None,
                      help="drop a sample with stale tokens, or mask only those tokens (default: settings)")
    data.add_argument("--max-sample-tokens", type=int, default=None, help="drop samples longer than N tokens")
    data.add_argument("--keep-zero-weight", action="store_true",
                      help="do not drop samples with no loss weight")
    data.add_argument("--drop-zero-advantage", action="store_true",
                      help="drop samples whose advantages are all zero")
    opt = p.add_argument_group("optimization")
    opt.add_argument("--layout", choices=("padded", "packed"), default="padded", help="collation layout")
    opt.add_argument("--micro-batch-tokens", type=int, default=8192,
                     help="tokens per forward/backward pass; gradients accumulate (0: whole step)")
    opt.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default: settings)")
    opt.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping (0: off)")
    opt.add_argument("--clip-low", type=float, default=0.2, help="PPO ratio floor 1 - x")
    opt.add_argument("--clip-high", type=float, default=0.2, help="PPO ratio ceiling 1 + x")
    opt.add_argument("--dual-clip", type=float, default=None, help="dual-clip bound for negative advantages")
    opt.add_argument("--ratio-cap", type=float, default=None,
                     help="truncated importance sampling with this cap instead of the clipped surrogate")
    opt.add_argument("--importance-sampling", choices=("auto", "none", "tis", "mis"), default=None,
                     help="engine/trainer logprob mismatch correction: truncated (tis) or masked (mis) "
                          "importance weights; auto: tis behind vLLM, none behind the embedded engine "
                          "(default: settings)")
    opt.add_argument("--importance-cap", type=float, default=None,
                     help="TIS truncation / MIS threshold (default: settings)")
    opt.add_argument("--mismatch-bound", type=float, default=None,
                     help="|trainer - engine| logprob counted as beyond the bound (default: settings)")
    opt.add_argument("--upstream", choices=("embedded", "vllm"), default=None,
                     help="the engine the samples came from, for --importance-sampling auto "
                          "(default: settings gateway.upstream)")
    opt.add_argument("--normalization", choices=("weight", "tokens", "samples"), default="weight",
                     help="loss denominator over the whole step (default: sum of token weights)")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from trainer_consumer.trainer import TrainOptions, run_training

    for name in ("max_steps", "batch_size", "steps_per_version", "max_batch_tokens", "max_sample_tokens",
                 "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CliError(f"--{name.replace('_', '-')} must be at least 1")
    if args.idle_timeout <= 0:
        raise CliError("--idle-timeout must be > 0")
    if args.max_staleness is not None and args.max_staleness < 0:
        raise CliError("--max-staleness must be >= 0")
    settings = get_settings()
    ts = settings.trainer
    upstream = args.upstream or settings.gateway.upstream
    try:
        loss = LossConfig(clip_low=args.clip_low, clip_high=args.clip_high, dual_clip=args.dual_clip,
                          ratio_cap=args.ratio_cap, normalization=args.normalization,
                          importance_sampling=resolve_importance_sampling(
                              args.importance_sampling or ts.importance_sampling, upstream),
                          importance_cap=args.importance_cap if args.importance_cap is not None
                          else ts.importance_cap)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    options = TrainOptions(
        max_steps=args.max_steps,
        until_idle=args.until_idle,
        idle_timeout_s=args.idle_timeout,
        flush_partial=args.flush_partial,
        batch_size=args.batch_size,
        max_batch_tokens=args.max_batch_tokens,
        run_id=args.run_id,
        group_id=args.group_id,
        filters=FilterConfig.from_settings(
            ts,
            max_staleness=args.max_staleness,
            stale_rule=args.stale_rule,
            max_tokens=args.max_sample_tokens,
            drop_zero_weight=not args.keep_zero_weight,
            drop_zero_advantage=args.drop_zero_advantage,
        ),
        learner=LearnerConfig(
            layout=args.layout,
            micro_batch_tokens=args.micro_batch_tokens or None,
            learning_rate=args.lr if args.lr is not None else settings.trainer.learning_rate,
            max_grad_norm=args.max_grad_norm or None,
            loss=loss,
            mismatch_bound=args.mismatch_bound if args.mismatch_bound is not None else ts.mismatch_bound,
        ),
        upstream=upstream,
        steps_per_version=args.steps_per_version,
        model_dir=args.model_dir,
        checkpoint_dir=args.checkpoint_dir,
        torch_threads=args.threads,
        release_model=(settings.release.model or settings.model.name) if args.follow_releases else None,
    )
    summary = run_training(settings, options, progress=lambda line: print(line, flush=True))
    filtered = ", ".join(f"{k}: {v}" for k, v in sorted(summary.filtered.items())) or "none"
    published = ", ".join(map(str, summary.versions_published)) or "none"
    print(f"trained {summary.steps} steps on {summary.samples} samples ({summary.tokens:,} tokens) in "
          f"{summary.seconds:.1f} s; stopped: {summary.stopped or 'interrupted'}; "
          f"versions published: {published}; filtered: {filtered}")
    return 0
