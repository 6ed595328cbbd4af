"""``tokentrail process``: run one processors worker (the faust app) until it is stopped.

Workers started with the same app id (settings.processors.app_id) form one consumer group and share
the partitions; start more for more throughput, up to settings.kafka.partitions. A worker that is
killed leaves its partitions to the others after ``--session-timeout`` seconds; restarted, it
restores its tables from their changelog topics and resumes from the committed offsets.

``tokentrail.runtime.process`` runs a worker as a subprocess with given settings (``python -m`` this module).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from processors.stream.worker import EXIT_STALLED, LOG_LEVELS, WorkerError
from tokentrail.errors import CliError
from tokentrail.runtime.process import WORKER_MODULE, instance_id
from tokentrail.settings import Settings, get_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loglevel", choices=LOG_LEVELS, default="info",
                        help="log level of the worker (default: info; progress is logged every 10 s)")
    parser.add_argument("--app-id", default=None,
                        help="consumer group / state id (default: settings.processors.app_id)")
    parser.add_argument("--topic-prefix", default="", metavar="PREFIX",
                        help="read and write PREFIX + every topic name (isolated pipelines, tests)")
    parser.add_argument("--grouping-config", type=Path, default=None, metavar="YAML",
                        help="grouping configuration (default: deploy/config/grouping.yaml; window and "
                        "grace come from settings.processors)")
    parser.add_argument("--verifiers", type=Path, default=None, metavar="YAML",
                        help="YAML list of verifier specs (default: settings.processors.verifiers)")
    parser.add_argument("--state-retention", type=float, default=3600.0, metavar="SECONDS",
                        help="how long emitted-attempt markers are kept after a rollout's last event "
                        "(default: 3600)")
    parser.add_argument("--tick", type=float, default=1.0, metavar="SECONDS",
                        help="how often expired attempts and due groups are looked for (default: 1)")
    parser.add_argument("--session-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long before a dead worker's partitions move to the others (default: 10)")
    parser.add_argument("--instance-id", default=None, metavar="ID",
                        help="static group membership (Kafka group.instance.id), unique per running worker: "
                        "a worker restarted with the same id takes its partitions back without a rebalance "
                        "(e.g. a StatefulSet pod name; '{hostname}' is replaced by the host name; "
                        "default: settings.processors.instance_id, empty for dynamic membership)")
    parser.add_argument("--stall-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="input waiting but no progress this long: log what the worker waits on and "
                        f"exit {EXIT_STALLED} for the supervisor to restart it; keep it above the longest verifier "
                        "run (default: 120; 0: never)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "process",
        help="run a stream-processors worker: calls + env -> rollouts -> groups, scores, rewards, "
             "credits, samples",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=_cmd_process)


def _settings_with(settings: Settings, app_id: str | None) -> Settings:
    if not app_id:
        return settings
    return settings.model_copy(update={"processors": settings.processors.model_copy(update={"app_id": app_id})})


def run_worker(args: argparse.Namespace, settings: Settings | None = None) -> int:
    """Resolve the worker's configuration from the settings and the flags, then run it
    (``processors.stream.worker``) with the kafka and processors sections."""
    from processors.errors import ConfigError
    from processors.stream.worker import run_worker as run_stream_worker
    from processors.stream.worker_config import StreamConfig

    settings = _settings_with(settings or get_settings(), args.app_id)
    try:
        cfg = StreamConfig.resolve(settings.kafka, settings.processors, topic_prefix=args.topic_prefix,
                                   grouping_path=args.grouping_config, verifiers_file=args.verifiers,
                                   state_retention_s=args.state_retention, tick_s=args.tick,
                                   session_timeout_s=args.session_timeout, stall_timeout_s=args.stall_timeout,
                                   instance_id=instance_id(args.instance_id, settings))
    except ConfigError as exc:
        raise WorkerError(str(exc)) from exc
    return run_stream_worker(cfg, loglevel=args.loglevel)


def _cmd_process(args: argparse.Namespace) -> int:
    try:
        return run_worker(args)
    except WorkerError as exc:
        raise CliError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {WORKER_MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_worker(args)
    except WorkerError as exc:
        print(f"processors worker: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
