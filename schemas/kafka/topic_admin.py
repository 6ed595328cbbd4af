"""Creating and checking tokentrail's topics on a broker (the catalogue is ``schemas.topics``).

``ensure_topics`` creates missing topics and reports (or fixes) configs that differ from the catalogue;
``list_topics`` fails fast, naming the cause, when the broker refuses the client's credentials.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
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

from schemas.kafka.config import KafkaSettings, admin_config
from schemas.topics import ALL_TOPICS, CALLS, ENV, TopicSpec


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


def ensure_gateway_topics(kafka: KafkaSettings, calls_topic: str, env_topic: str) -> EnsureReport:
    """Every catalogue topic, with the calls and env topics under the names a gateway publishes to: a command
    that starts a gateway of its own calls this first, since on a fresh broker (no auto-creation) the gateway
    would spool every record and retry "Unknown topic or partition" for ever."""
    renamed = {CALLS.name: replace(CALLS, name=calls_topic), ENV.name: replace(ENV, name=env_topic)}
    specs = tuple(renamed.get(spec.name, spec) for spec in ALL_TOPICS)
    return ensure_topics(AdminClient(admin_config(kafka)), kafka, specs)


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
