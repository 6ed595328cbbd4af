"""Every Kafka topic of tokentrail in one place: name, key, value schemas, partitions, retention.

Everything about one rollout is keyed by its rollout id, so one partition holds a rollout's whole
history in order; groups are keyed by group id. Client configuration helpers live here too, so
producers, consumers and topics agree on message sizes and compression (``schemas.kafka_config``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from schemas.kafka_config import KafkaSettings

FOREVER = -1
DAY_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    key: str  # which field of the value the record key is
    value_schemas: tuple[str, ...]  # Avro record names in schemas/*.avsc
    retention_ms: int
    description: str
    # None: KafkaSettings.partitions. A fixed count where order across keys matters.
    partitions: int | None = None
    cleanup_policy: str = "delete"
    extra_config: dict[str, str] = field(default_factory=dict)

    def partition_count(self, kafka: KafkaSettings) -> int:
        return self.partitions if self.partitions is not None else kafka.partitions

    def config(self, kafka: KafkaSettings) -> dict[str, str]:
        """Topic-level configs this spec requires (compared against, and applied to, the broker)."""
        return {
            "cleanup.policy": self.cleanup_policy,
            "retention.ms": str(self.retention_ms),
            "compression.type": kafka.compression,
            "max.message.bytes": str(kafka.max_message_bytes),
            # acks=all waits for this many replicas (kafka.min_insync_replicas; 2 of 3 on a cluster).
            "min.insync.replicas": str(kafka.min_insync_replicas),
            **self.extra_config,
        }


CALLS = TopicSpec(
    "tokentrail.calls", "rollout_id", ("CallRecord",), FOREVER,
    "Immutable, token-exact model call records from the gateway (source of truth).",
)
ENV = TopicSpec(
    "tokentrail.env", "rollout_id", ("AttemptStarted", "EnvStep", "AttemptFinished"), FOREVER,
    "Environment traces: attempt start, steps and finish (source of truth).",
)
ROLLOUTS = TopicSpec(
    "tokentrail.rollouts", "rollout_id", ("CompletedRollout",), FOREVER,
    "Assembled rollout attempts, complete or incomplete, with token-prefix checks.",
)
GROUPS = TopicSpec(
    "tokentrail.groups", "group_id", ("RolloutGroup",), FOREVER,
    "Closed rollout groups (full or timed out) and late arrivals.",
)
SCORES = TopicSpec(
    "tokentrail.scores", "rollout_id", ("Score",), FOREVER,
    "Raw verifier output, never changed; replay derives rewards from it.",
)
REWARDS = TopicSpec(
    "tokentrail.rewards", "rollout_id", ("Reward",), FOREVER,
    "Rewards under a versioned reward configuration.",
)
CREDITS = TopicSpec(
    "tokentrail.credits", "rollout_id", ("Credit",), FOREVER,
    "Advantages/weights under a versioned credit configuration.",
)
SAMPLES = TopicSpec(
    "tokentrail.samples", "rollout_id", ("Sample",), 30 * DAY_MS,
    "Trainable samples (key: the first rollout id of the sample). The largest topic; replay "
    "re-derives it from scores and rollouts, and ClickHouse keeps every sample for audit.",
)
TRAINER_STEPS = TopicSpec(
    "tokentrail.trainer-steps", "run_id", ("TrainerStep",), FOREVER,
    "One event per optimizer step naming the samples it used; one partition keeps steps in order.",
    partitions=1,
)
DEAD_LETTER = TopicSpec(
    "tokentrail.dead-letter", "key of the failed record", ("DeadLetter",), 365 * DAY_MS,
    "Records a stage could not process, with the source position and the reason.",
)
FEEDBACK = TopicSpec(
    "tokentrail.feedback", "target_id", ("Feedback",), FOREVER,
    "Outside signals about a response, call, session or rollout (source of truth); the feedback join "
    "resolves each to its rollouts.",
)
# Keyed by the release track (the served model name), on one partition: every reader (gateways, the
# controller, `tokentrail release status`) folds all decisions in one total order, so a decision's
# sequence number alone tells whether it was the next one. A few records a day; kept forever for audit.
RELEASE_DECISIONS = TopicSpec(
    "tokentrail.release-decisions", "model", ("ReleaseDecision",), FOREVER,
    "Which policy versions serve which share of sessions: the release controller's and operators' "
    "decisions (start, ramp, promote, rollback, pin), in order.",
    partitions=1,
)

# Keyed by the grouping key, so one key's windows (and the running baseline's chain) sit in order.
BASELINES = TopicSpec(
    "tokentrail.baselines", "key", ("Baseline",), FOREVER,
    "Baselines without siblings: each closed window of a grouping key, the baseline every advantage in it "
    "was measured against (the group's, or the key's running baseline) and the running state before and after.",
)

ALL_TOPICS: tuple[TopicSpec, ...] = (
    CALLS, ENV, ROLLOUTS, GROUPS, SCORES, REWARDS, CREDITS, SAMPLES, TRAINER_STEPS, DEAD_LETTER,
    FEEDBACK, RELEASE_DECISIONS, BASELINES,
)
BY_NAME: dict[str, TopicSpec] = {spec.name: spec for spec in ALL_TOPICS}

# Plain names for producers and consumers.
CALLS_TOPIC = CALLS.name
ENV_TOPIC = ENV.name
ROLLOUTS_TOPIC = ROLLOUTS.name
GROUPS_TOPIC = GROUPS.name
SCORES_TOPIC = SCORES.name
REWARDS_TOPIC = REWARDS.name
CREDITS_TOPIC = CREDITS.name
SAMPLES_TOPIC = SAMPLES.name
TRAINER_STEPS_TOPIC = TRAINER_STEPS.name
DEAD_LETTER_TOPIC = DEAD_LETTER.name
FEEDBACK_TOPIC = FEEDBACK.name
RELEASE_DECISIONS_TOPIC = RELEASE_DECISIONS.name


def topic(name: str) -> TopicSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown tokentrail topic {name!r}; known: {', '.join(BY_NAME)}") from None


# ---------------------------------------------------------------- creating and checking topics


def list_topics(admin: AdminClient, timeout_s: float = 30.0) -> Any:
    """``admin.list_topics`` that fails within seconds, naming the cause, when the broker refuses the
    client's credentials (the client built from ``admin_config``); other failures retry until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return admin.list_topics(timeout=max(min(2.0, deadline - time.monotonic()), 0.1))
        except KafkaException:
            _raise_refused_login(admin)
            if time.monotonic() >= deadline:
                raise


def _raise_refused_login(admin: AdminClient) -> None:
    """Raise the authentication failure ``raise_authentication_failure`` saw, if any, as a fresh exception.

    The one raised inside the callback stays referenced by the client; through its traceback and context
    it would reference the client's own frames, a cycle the garbage collector cannot see through the C
    object, keeping the client (and its reconnecting threads) alive."""
    try:
        admin.poll(0)
    except KafkaException as refused:
        refused.__traceback__ = refused.__context__ = refused.__cause__ = None
        error = refused.args[0]
    else:
        return
    raise KafkaException(error)


@dataclass(frozen=True)
class TopicDifference:
    topic: str
    setting: str
    expected: str
    actual: str

    def describe(self) -> str:
        return f"{self.topic}: {self.setting} is {self.actual}, expected {self.expected}"


@dataclass
class EnsureReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    altered: list[TopicDifference] = field(default_factory=list)
    differences: list[TopicDifference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences


def topic_differences(
    spec: TopicSpec, kafka: KafkaSettings, partitions: int, configs: dict[str, str]
) -> list[TopicDifference]:
    """How an existing topic (its partition count and configs) departs from its spec."""
    found = []
    expected_partitions = spec.partition_count(kafka)
    if partitions != expected_partitions:
        found.append(TopicDifference(spec.name, "partitions", str(expected_partitions), str(partitions)))
    for key, expected in spec.config(kafka).items():
        actual = configs.get(key, "<unset>")
        if actual != expected:
            found.append(TopicDifference(spec.name, key, expected, actual))
    return found


def ensure_topics(
    admin: AdminClient,
    kafka: KafkaSettings,
    specs: tuple[TopicSpec, ...] = ALL_TOPICS,
    *,
    fix_configs: bool = False,
    timeout_s: float = 30.0,
) -> EnsureReport:
    """Create missing topics; compare existing ones with their specs.

    Topic configs that differ are set when ``fix_configs`` is true. A partition count that differs
    is only reported: adding partitions would move keys, splitting a rollout's history. So is a topic
    with fewer replicas than ``kafka.min_insync_replicas`` (no acks=all write could succeed on it); its
    ``min.insync.replicas`` is then left as it is, even with ``fix_configs``.
    """
    report = EnsureReport()
    present = list_topics(admin, timeout_s).topics
    missing = [spec for spec in specs if spec.name not in present]
    if missing:
        new_topics = [
            # replication_factor=-1: the broker's default.replication.factor (1 locally, 3 in a cluster).
            NewTopic(
                spec.name, spec.partition_count(kafka), replication_factor=-1, config=spec.config(kafka)
            )
            for spec in missing
        ]
        futures = admin.create_topics(new_topics, operation_timeout=timeout_s, request_timeout=timeout_s)
        for name, future in futures.items():
            try:
                future.result()
                report.created.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # lost a race: check it below
                    raise
    created = set(report.created)
    shapes = _topic_shapes(admin, [spec.name for spec in specs], timeout_s)
    to_check = [spec for spec in specs if spec.name not in created]
    names = [spec.name for spec in to_check]
    configs_by_topic = describe_topic_configs(admin, names, timeout_s) if names else {}
    for spec in specs:
        partitions, replicas = shapes[spec.name]
        too_few = replicas < kafka.min_insync_replicas
        if too_few:
            report.differences.append(TopicDifference(
                spec.name, "replication factor", f">= {kafka.min_insync_replicas} (min.insync.replicas)",
                str(replicas)))
        if spec.name in created:
            continue
        report.existing.append(spec.name)
        differences = topic_differences(spec, kafka, partitions, configs_by_topic[spec.name])
        kept = {"partitions", "min.insync.replicas"} if too_few else {"partitions"}
        config_fixes = [d for d in differences if d.setting not in kept]
        if fix_configs and config_fixes:
            _set_topic_configs(admin, spec.name, config_fixes, timeout_s)
            report.altered.extend(config_fixes)
            differences = [d for d in differences if d.setting in kept]
        report.differences.extend(differences)
    return report


# The broker serves metadata and configs from a cache that follows the controller, so a topic
# created (or changed) a moment ago may not show yet: lookups retry until their timeout.


def _topic_shapes(admin: AdminClient, names: list[str], timeout_s: float) -> dict[str, tuple[int, int]]:
    """(partition count, fewest replicas of any partition) of each named topic."""
    deadline = time.monotonic() + timeout_s
    while True:
        present = list_topics(admin, timeout_s).topics
        missing = [name for name in names if name not in present or not present[name].partitions]
        if not missing:
            return {name: (len(present[name].partitions),
                           min(len(p.replicas) for p in present[name].partitions.values())) for name in names}
        if time.monotonic() > deadline:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"topics not found: {missing}"))
        time.sleep(0.2)


def describe_topic_configs(
    admin: AdminClient, names: list[str], timeout_s: float = 30.0
) -> dict[str, dict[str, str]]:
    """Every config of each named topic, as the broker reports it."""
    deadline = time.monotonic() + timeout_s
    found: dict[str, dict[str, str]] = {}
    while True:
        pending = [ConfigResource(ResourceType.TOPIC, name) for name in names if name not in found]
        unknown = []
        for resource, future in admin.describe_configs(pending, request_timeout=timeout_s).items():
            try:
                found[resource.name] = {key: entry.value for key, entry in future.result().items()}
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                    raise
                unknown.append(resource.name)
        if not unknown:
            return found
        time.sleep(0.2)


def _set_topic_configs(
    admin: AdminClient, name: str, fixes: list[TopicDifference], timeout_s: float
) -> None:
    entries = [
        ConfigEntry(fix.setting, fix.expected, incremental_operation=AlterConfigOpType.SET) for fix in fixes
    ]
    resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource], request_timeout=timeout_s).values():
        future.result()
