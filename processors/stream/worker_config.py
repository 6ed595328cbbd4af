"""Everything one processors worker needs to know, resolved from its settings sections (kafka,
processors) and the configuration files they name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from processors.baselines.config import BaselineConfig
from processors.config import load_config, parse_config
from processors.errors import ConfigError
from processors.feedback.config import FeedbackRewardConfig, load_feedback_config
from processors.grouper import GroupingConfig
from processors.pipeline import StageConfigs
from processors.stream.settings import ProcessorSettings
from processors.stream.topics import StreamTopics
from processors.verifiers.base import Verifier, load_verifiers, load_verifiers_file
from schemas.kafka.config import KafkaSettings
from schemas.local_paths import REPO_ROOT

DEFAULT_GROUPING = REPO_ROOT / "deploy" / "config" / "grouping.yaml"


def load_grouping(processors: ProcessorSettings, path: Path | None = None) -> GroupingConfig:
    """The grouping YAML with window and grace taken from the processors section (they win)."""
    path = path or DEFAULT_GROUPING
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read grouping config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    data.update(window_s=processors.group_window_s, grace_s=processors.group_grace_s)
    return parse_config(GroupingConfig, data, str(path))


@dataclass(frozen=True)
class StreamConfig:
    kafka: KafkaSettings
    processors: ProcessorSettings
    topics: StreamTopics
    grouping: GroupingConfig
    stages: StageConfigs
    verifiers: tuple[Verifier, ...]
    # Emitted-attempt and closed-group markers are kept this long after their last event, so
    # re-deliveries and stragglers are recognised; then the state is dropped.
    state_retention_s: float = 3600.0
    tick_s: float = 1.0  # how often the timers look for expired attempts and due groups
    session_timeout_s: float = 10.0  # a killed worker's partitions move after this long
    stall_timeout_s: float = 120.0  # waiting input and no progress this long: stop (0: never)
    # Static group membership (Kafka group.instance.id): a worker restarted with the same id takes its
    # place back without a rebalance. None: dynamic membership.
    instance_id: str | None = None
    feedback: FeedbackRewardConfig | None = None  # the feedback join's rules; None: the join is off
    baselines: BaselineConfig | None = None  # baselines without siblings; None: off

    @property
    def app_id(self) -> str:
        return self.processors.app_id

    @property
    def max_rollout_bytes(self) -> int:
        """The byte cap of one rollout's open state (room left for the rollout record's own fields)."""
        return self.processors.max_rollout_bytes or self.kafka.max_message_bytes * 3 // 4

    @classmethod
    def resolve(cls, kafka: KafkaSettings, processors: ProcessorSettings, *, topic_prefix: str = "",
                grouping_path: Path | None = None, verifiers_file: Path | None = None,
                state_retention_s: float = 3600.0, tick_s: float = 1.0, session_timeout_s: float = 10.0,
                stall_timeout_s: float = 120.0, instance_id: str | None = None) -> StreamConfig:
        """Load the grouping, stage and verifier configurations that the sections (or the arguments)
        name; a ConfigError says what is wrong with them."""
        verifiers = (load_verifiers_file(str(verifiers_file)) if verifiers_file
                     else load_verifiers(list(processors.verifiers)))
        return cls(kafka=kafka, processors=processors, topics=StreamTopics(topic_prefix),
                   grouping=load_grouping(processors, grouping_path),
                   stages=StageConfigs.load(processors.reward_config, processors.credit_config,
                                            processors.sample_config),
                   verifiers=tuple(verifiers), state_retention_s=state_retention_s, tick_s=tick_s,
                   session_timeout_s=session_timeout_s, stall_timeout_s=stall_timeout_s, instance_id=instance_id,
                   feedback=load_feedback_config(processors.feedback_config) if processors.feedback_join else None,
                   baselines=load_config(BaselineConfig, processors.baseline_config) if processors.baselines else None)
