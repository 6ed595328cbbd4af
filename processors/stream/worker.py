"""Run one processors worker (the faust app) from a resolved StreamConfig until it is stopped.

Workers started with the same app id (the processors section's app_id) form one consumer group and
share the partitions; start more for more throughput, up to the kafka section's partitions. A worker
that is killed leaves its partitions to the others after its session timeout; restarted, it restores
its tables from their changelog topics and resumes from the committed offsets.

The command line (``tokentrail process``, ``tokentrail.commands.process``) and the subprocess launcher
(``tokentrail.runtime.process``) live in the shell; this module takes the kafka and processors sections in the config.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from schemas.kafka.config import KafkaSettings

if TYPE_CHECKING:
    from processors.stream.worker_config import StreamConfig

LOG_LEVELS = ("debug", "info", "warning", "error")
EXIT_STALLED = 3


class WorkerError(RuntimeError):
    """The worker cannot start (configuration, topics); the message says why."""


def run_worker(cfg: StreamConfig, *, loglevel: str = "info") -> int:
    """Create the topics if needed, then run the faust worker until SIGTERM / Ctrl-C; the exit code
    (``EXIT_STALLED`` when the watchdog stopped it)."""
    from confluent_kafka import KafkaException
    from faust.worker import Worker

    from processors.stream.app import ProcessorsApp, StalledError
    from processors.stream.topics import ensure_stream_topics

    kafka = cfg.kafka
    try:
        report = ensure_stream_topics(kafka, cfg.topics)
    except KafkaException as exc:
        raise WorkerError(f"Kafka at {kafka.bootstrap_servers} is not usable: {exc}") from exc
    wrong_partitions = [d for d in report.differences if d.setting == "partitions"]
    if wrong_partitions:
        # Input topics and the changelogs must have the same partition count (co-partitioning).
        raise WorkerError("; ".join(d.describe() for d in wrong_partitions))
    (cfg.processors.state_dir / cfg.app_id).mkdir(parents=True, exist_ok=True)
    processors = ProcessorsApp(cfg)
    try:
        ensure_changelog_topics(kafka, processors.app)
    except KafkaException as exc:
        raise WorkerError(f"changelog topics on {kafka.bootstrap_servers}: {exc}") from exc
    log = logging.getLogger("tokentrail.processors")
    worker = Worker(processors.app, loglevel=loglevel, redirect_stdouts=False, quiet=True)
    log.info("processors worker: app id %s, %d partitions, topics %s*, verifiers %s", cfg.app_id,
             kafka.partitions, cfg.topics.prefix or "", [v.name for v in cfg.verifiers])
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    else:
        code = 0
    if isinstance(processors.crashed, StalledError):
        return EXIT_STALLED
    return 1 if processors.crashed is not None else code


def ensure_changelog_topics(kafka: KafkaSettings, app: Any, timeout_s: float = 30.0) -> None:
    """Create the tables' changelog topics before the consumer starts, and wait until they show.

    Faust creates them itself on start, but a group leader whose metadata predates them leaves them
    out of its assignments until its metadata refresh (minutes), so a partition that moves in a
    rebalance meanwhile is not restored: its state is lost (reliability fault f, on a fresh cluster)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    from schemas.kafka.config import admin_config

    admin = AdminClient(admin_config(kafka))
    wanted = {}
    for table in app.tables.values():
        topic = table.changelog_topic
        name = topic.get_topic_name()
        config = {"cleanup.policy": "compact", **{k: str(v) for k, v in (topic.config or {}).items()}}
        wanted[name] = NewTopic(name, topic.partitions, topic.replicas or app.conf.topic_replication_factor,
                                config=config)
    present = admin.list_topics(timeout=timeout_s).topics
    missing = [new for name, new in wanted.items() if name not in present]
    if missing:
        for future in admin.create_topics(missing, operation_timeout=timeout_s).values():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another worker was first
                    raise
    deadline = time.monotonic() + timeout_s
    while True:  # the broker's metadata follows the controller a moment later
        topics = admin.list_topics(timeout=timeout_s).topics
        if all(name in topics and topics[name].partitions for name in wanted):
            return
        if time.monotonic() > deadline:
            raise WorkerError(f"changelog topics not visible after {timeout_s:g}s: {sorted(wanted)}")
        time.sleep(0.2)
