"""Every Kafka topic of tokentrail in one place: name, key, value schemas, partitions, retention.

Everything about one rollout is keyed by its rollout id, so one partition holds a rollout's whole
history in order; groups are keyed by group id. This is the catalogue (part of the contract, no client);
creating and checking the topics on a broker is ``schemas.kafka.topic_admin``, and the client settings
that producers, consumers and topics agree on (message sizes, compression) are ``schemas.kafka.config``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class TopicDefaults(Protocol):
    """What a topic spec reads from the client settings (``schemas.kafka.config.KafkaSettings`` has it):
    the catalogue names its needs without importing the Kafka plumbing."""

    partitions: int
    compression: str
    max_message_bytes: int
    min_insync_replicas: int

FOREVER = -1
DAY_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    key: str  # which field of the value the record key is
    value_schemas: tuple[str, ...]  # Avro record names in schemas/*.avsc
    retention_ms: int
    description: str
    # None: the settings' partitions (KafkaSettings.partitions). A fixed count where order across keys matters.
    partitions: int | None = None
    cleanup_policy: str = "delete"
    extra_config: dict[str, str] = field(default_factory=dict)
    # False: the ClickHouse sink never copies this topic (the data keys: a copy elsewhere would outlive a forget).
    sunk: bool = True

    def partition_count(self, kafka: TopicDefaults) -> int:
        return self.partitions if self.partitions is not None else kafka.partitions

    def config(self, kafka: TopicDefaults) -> dict[str, str]:
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

# Forgetting (docs/forgetting.md). The key store of record: each subject's data keys, wrapped by the operator's
# master key, compacted so a tombstone removes a key for good; never sunk, never copied. Compaction runs
# soon (dirty ratio, segment age), so a destroyed key leaves the log within minutes, not at retention.
SUBJECT_KEYS = TopicSpec(
    "tokentrail.subject-keys", "key_id", ("SubjectKey",), FOREVER,
    "Per-subject data keys wrapped by the master key (compacted; a tombstone destroys a key).",
    partitions=1, cleanup_policy="compact", sunk=False,
    extra_config={"min.cleanable.dirty.ratio": "0.01", "segment.ms": str(60 * 60 * 1000),
                  "delete.retention.ms": str(60 * 60 * 1000)},
)
FORGOTTEN = TopicSpec(
    "tokentrail.forgotten", "subject", ("Forgotten",), FOREVER,
    "Immutable record of every forget request: who asked, when, which subject and keys; never content.",
    partitions=1,
)

ALL_TOPICS: tuple[TopicSpec, ...] = (
    CALLS, ENV, ROLLOUTS, GROUPS, SCORES, REWARDS, CREDITS, SAMPLES, TRAINER_STEPS, DEAD_LETTER,
    FEEDBACK, RELEASE_DECISIONS, BASELINES, SUBJECT_KEYS, FORGOTTEN,
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
SUBJECT_KEYS_TOPIC = SUBJECT_KEYS.name
FORGOTTEN_TOPIC = FORGOTTEN.name


def topic(name: str) -> TopicSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown tokentrail topic {name!r}; known: {', '.join(BY_NAME)}") from None
