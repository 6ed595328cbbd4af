"""``tokentrail reliability [--quick]``: the bad-input corpus plus fault scenarios with real processes.

Prints progress, then a table (each input class and fault: what was tried, what was lost, what was
duplicated) and, as the last line, one JSON object with at least ``lost``, ``duplicated``, ``faults``
and ``bad_inputs``. Exit code 0 only when every case got its stated answer and nothing was lost or
duplicated.

Needs the shared broker (settings.kafka; started if not running). The broker fault, the scale-out fault
(two gateways, three workers on six partitions, one worker killed), the cluster fault (three brokers, the
calls leader killed -9) and the poison / disk-full faults run their own private brokers on free ports, so
the shared one is never stopped. The disk-full fault mounts a size-limited tmpfs: it needs root.

Faults: a broker stopped, b worker kill -9, c sink kill -9, d every record twice, e gateway kill -9 with a
spool, f scale-out, g three-broker cluster with the calls leader killed -9, h rebalance chaos (workers
added and removed every 20-30 s; five minutes, about 75 s with --quick), i gateway restarted mid-session,
j poison record (5 MB request, a record over the broker's limit), k disk-full spool, l the baseline agents'
worker killed -9 twice mid-stream (Baseline events and the rewards, credits and samples measured against
them equal a clean run's), m hostile feedback, n a --processes 4 gateway with organic sessions (a worker
killed -9 mid-window, then the whole gateway restarted: every session one COMPLETE rollout), o costly
requests, p a trainer rank killed -9.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

FAULTS = ("broker", "worker", "twice", "scale", "cluster", "chaos", "restart", "poison", "baselines", "rank",
          "feedback", "sessions", "costly")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "reliability", help="fault and bad-input suite; prints what was lost or duplicated",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="smaller workloads (under 25 minutes here)")
    parser.add_argument("--skip", action="append", choices=("corpus", *FAULTS), default=[],
                        help="leave out a part (repeatable): corpus, broker (faults a+e), worker (faults b+c), "
                        "twice (fault d), scale (fault f: 2 gateways, 3 workers, one killed), cluster (fault g: "
                        "3 brokers, leader killed -9), chaos (fault h: rebalance chaos), restart (fault i: gateway "
                        "restarted mid-session), poison (faults j+k: poison record, disk-full spool; needs root), "
                        "baselines (fault l: the baseline agents' worker killed -9), rank (fault p: one of 2 trainer "
                        "ranks killed -9 mid-step under torchrun --max-restarts), feedback (fault m: "
                        "hostile feedback), sessions (fault n: a --processes 4 gateway with organic sessions, a worker "
                        "killed -9, then the gateway restarted), costly (fault o: requests built for the most CPU "
                        "per byte)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where spools, private broker data, chDB and logs go (default: a temp dir)")


def run(args: argparse.Namespace) -> int:
    from reliability import (
        baseline_kills,
        cluster_fault,
        costly_requests_fault,
        faults,
        gateway_restart,
        hostile_feedback_fault,
        organic_sessions_fault,
        poison_and_disk,
        rank_kill,
        rebalance_chaos,
        scale_out,
    )
    from reliability.corpus import run_corpus
    from reliability.results import Summary, table
    from tokentrail import kafka_local
    from tokentrail.settings import get_settings

    settings = get_settings()
    began = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - began:6.0f}s] {line}", file=sys.stderr, flush=True)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tokentrail-reliability-"))
    workdir.mkdir(parents=True, exist_ok=True)
    progress(f"workdir {workdir}")
    if not kafka_local.broker_answers(settings.kafka):
        kafka_local.start(wait_s=120, kafka=settings.kafka, echo=progress)
    sizes = faults.QUICK if args.quick else faults.FULL
    summary = Summary()
    if "corpus" not in args.skip:
        summary = run_corpus(settings, workdir / "corpus", progress)
        progress(f"bad inputs: {len(summary.cases)} cases, {len(summary.failed_cases)} failed")
    steps = [("broker", lambda: faults.broker_and_gateway(settings, workdir / "broker", sizes, progress)),
             ("worker", lambda: faults.worker_and_sink_kills(settings, workdir, sizes, progress)),
             ("twice", lambda: [faults.double_delivery(settings, workdir, sizes, progress)]),
             ("scale", lambda: [scale_out.scale_out(settings, workdir / "scale-out",
                                                    scale_out.QUICK if args.quick else scale_out.FULL, progress)]),
             ("cluster", lambda: [cluster_fault.cluster_fault(
                 settings, workdir / "cluster", cluster_fault.QUICK if args.quick else cluster_fault.FULL, progress)]),
             ("chaos", lambda: [rebalance_chaos.rebalance_chaos(
                 settings, workdir, rebalance_chaos.QUICK if args.quick else rebalance_chaos.FULL, progress)]),
             ("restart", lambda: [gateway_restart.gateway_restart(settings, workdir / "gateway-restart", sizes,
                                                                  progress)]),
             ("poison", lambda: poison_and_disk.poison_and_disk(
                 settings, workdir / "poison-disk", poison_and_disk.QUICK if args.quick else poison_and_disk.FULL,
                 progress)),
             ("baselines", lambda: [baseline_kills.baseline_worker_kills(settings, workdir / "baseline-kills",
                                                                         progress)]),
             ("rank", lambda: [rank_kill.rank_kill_fault(settings, workdir / "rank-kill", progress)]),
             ("feedback", lambda: [hostile_feedback_fault.hostile_feedback_fault(
                 settings, workdir / "hostile-feedback", progress)]),
             ("sessions", lambda: [organic_sessions_fault.organic_sessions_fault(
                 settings, workdir / "organic-sessions", progress)]),
             ("costly", lambda: [costly_requests_fault.costly_requests_fault(settings, workdir / "costly-requests",
                                                                             progress)])]
    for name, step in steps:
        if name in args.skip:
            continue
        try:
            summary.faults += step()
        except Exception as exc:  # a scenario that cannot finish is a failed fault, not a crash
            progress(f"fault {name}: could not finish: {exc!r}")
            summary.faults.append(faults.FaultResult(f"{name} (did not finish)", repr(exc)[:200], 0, 0, False))
    print(table(summary))
    for case in summary.failed_cases:
        print(f"FAILED {case.id}: {case.detail}")
    for fault in summary.faults:
        if fault.detail:
            print(f"{fault.name}: {fault.detail}")
    print(json.dumps({**summary.as_json(), "seconds": round(time.monotonic() - began, 1),
                      "mode": "quick" if args.quick else "full"}))
    return 0 if summary.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
