"""The topics the processors app reads and writes, optionally under a name prefix.

A prefix gives a test (or a second pipeline on one cluster) a private copy of every topic; the
production app uses none. ``ROLLOUTS_BY_GROUP`` is the app's internal repartition topic: complete,
counted rollouts keyed by group id, so one grouper worker sees all of a group.

Record keys go to partitions the way librdkafka's default partitioner (``consistent_random``,
CRC32 of the key) places them, so rollouts, scores and samples produced by the faust app land where
confluent-kafka producers elsewhere in tokentrail would put the same key.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from typing import Any

from confluent_kafka.admin import AdminClient

from schemas import topics as T
from schemas.kafka import config as kafka_config
from schemas.kafka import topic_admin
from schemas.kafka.config import KafkaSettings

ROLLOUTS_BY_GROUP = T.TopicSpec(
    "tokentrail.rollouts-by-group", "group_id", ("CompletedRollout",), 7 * T.DAY_MS,
    "Internal to the processors app: complete, counted rollouts repartitioned by group id.",
)
# Internal to the feedback join (feedback/messages.py: JSON values): feedback and call ids keyed by what
# feedback names ("call:<id>", "session:<id>"), then feedback and completed rollouts keyed by rollout id.
FEEDBACK_BY_TARGET = T.TopicSpec(
    "tokentrail.feedback-by-target", "target key", (), 7 * T.DAY_MS,
    "Internal to the processors app: feedback and the call/session ids of calls, keyed by the id feedback names.",
)
FEEDBACK_BY_ROLLOUT = T.TopicSpec(
    "tokentrail.feedback-by-rollout", "rollout_id", (), 7 * T.DAY_MS,
    "Internal to the processors app: resolved feedback and completed rollouts, keyed by rollout id.",
)
# Internal to the baselines (baselines/messages.py): what pairs a rollout attempt with its feedback reward (the
# rollout, its first call's cluster key, the reward), keyed by rollout id; then the paired members, keyed by the
# grouping key, so one worker holds a key's windows and running baseline.
BASELINE_BY_ROLLOUT = T.TopicSpec(
    "tokentrail.baseline-by-rollout", "rollout_id", (), 7 * T.DAY_MS,
    "Internal to the processors app: rollouts, first-call keys and feedback rewards for the baselines, by rollout id.",
)
BASELINE_BY_KEY = T.TopicSpec(
    "tokentrail.baseline-by-key", "grouping key", (), 7 * T.DAY_MS,
    "Internal to the processors app: rewarded rollouts for the baselines, keyed by their grouping key.",
)

# Which topic each emitted record goes to.
OUTPUT_SPECS: dict[str, T.TopicSpec] = {
    "CompletedRollout": T.ROLLOUTS, "RolloutGroup": T.GROUPS, "Score": T.SCORES, "Reward": T.REWARDS,
    "Credit": T.CREDITS, "Sample": T.SAMPLES, "DeadLetter": T.DEAD_LETTER, "Baseline": T.BASELINES,
}


def record_key(name: str, record: dict[str, Any]) -> str:
    """The Kafka key of an emitted record: its rollout id (a sample's first), a group's group id."""
    if name == "RolloutGroup":
        return str(record["group_id"])
    if name == "Sample":
        return str(record["rollout_ids"][0])
    if name == "Baseline":
        return str(record["key"])
    return str(record["rollout_id"])


def partition_for(key: bytes, partitions: int) -> int:
    """librdkafka's ``consistent_random`` placement of a non-empty key."""
    return zlib.crc32(key) % partitions


@dataclass(frozen=True)
class StreamTopics:
    """Topic names as the app uses them: ``prefix + spec.name``."""

    prefix: str = ""

    def name(self, spec: T.TopicSpec) -> str:
        return f"{self.prefix}{spec.name}"

    @property
    def calls(self) -> str:
        return self.name(T.CALLS)

    @property
    def env(self) -> str:
        return self.name(T.ENV)

    @property
    def rollouts(self) -> str:
        return self.name(T.ROLLOUTS)

    @property
    def by_group(self) -> str:
        return self.name(ROLLOUTS_BY_GROUP)

    @property
    def feedback(self) -> str:
        return self.name(T.FEEDBACK)

    @property
    def feedback_by_target(self) -> str:
        return self.name(FEEDBACK_BY_TARGET)

    @property
    def feedback_by_rollout(self) -> str:
        return self.name(FEEDBACK_BY_ROLLOUT)

    @property
    def rewards(self) -> str:
        return self.name(T.REWARDS)

    @property
    def baseline_by_rollout(self) -> str:
        return self.name(BASELINE_BY_ROLLOUT)

    @property
    def baseline_by_key(self) -> str:
        return self.name(BASELINE_BY_KEY)

    @property
    def dead_letter(self) -> str:
        return self.name(T.DEAD_LETTER)

    def output(self, record_name: str) -> str:
        return self.name(OUTPUT_SPECS[record_name])

    def specs(self) -> tuple[T.TopicSpec, ...]:
        """Every topic the app touches (inputs, outputs, internal), renamed with the prefix."""
        wanted: list[T.TopicSpec] = []
        for spec in (T.CALLS, T.ENV, *OUTPUT_SPECS.values(), ROLLOUTS_BY_GROUP, T.FEEDBACK, FEEDBACK_BY_TARGET,
                     FEEDBACK_BY_ROLLOUT, BASELINE_BY_ROLLOUT, BASELINE_BY_KEY):
            if spec not in wanted:
                wanted.append(spec)
        return tuple(dataclasses.replace(spec, name=self.name(spec)) for spec in wanted)


def ensure_stream_topics(kafka: KafkaSettings, topics: StreamTopics, *,
                         timeout_s: float = 30.0) -> topic_admin.EnsureReport:
    """Create the app's topics where missing (a running broker is required)."""
    admin = AdminClient(kafka_config.admin_config(kafka))
    return topic_admin.ensure_topics(admin, kafka, topics.specs(), timeout_s=timeout_s)
