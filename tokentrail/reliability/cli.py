"""``tokentrail reliability [--quick]``: the bad-input corpus plus fault scenarios with real processes.

Prints progress, then a table (each input class and fault: what was tried, what was lost, what was
duplicated) and, as the last line, one JSON object with at least ``lost``, ``duplicated``, ``faults``
and ``bad_inputs``. Exit code 0 only when every case got its stated answer and nothing was lost or
duplicated.

Needs the shared broker (settings.kafka; started if not running). The broker fault and the scale-out fault
(two gateways, three workers on six partitions, one worker killed) run their own private brokers on free
ports, so the shared one is never stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

FAULTS = ("broker", "worker", "twice", "scale")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "reliability", help="fault and bad-input suite; prints what was lost or duplicated",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="smaller workloads (well under 20 minutes here)")
    parser.add_argument("--skip", action="append", choices=("corpus", *FAULTS), default=[],
                        help="leave out a part: corpus, broker (faults a+e), worker (faults b+c), twice (fault d), "
                        "scale (fault f: 2 gateways, 3 workers, one killed)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where spools, private broker data, chDB and logs go (default: a temp dir)")


def run(args: argparse.Namespace) -> int:
    from tokentrail import kafka_local
    from tokentrail.reliability import faults, scale_out
    from tokentrail.reliability.corpus import run_corpus
    from tokentrail.reliability.results import Summary, table
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
                                                    scale_out.QUICK if args.quick else scale_out.FULL, progress)])]
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
    parser = argparse.ArgumentParser(prog="python -m tokentrail.reliability.cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
