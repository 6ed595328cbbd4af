"""The ``processors`` settings section (``TOKENTRAIL_PROCESSORS__*``), read by the stream workers."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from schemas.local_paths import DEPLOY_CONFIG_DIR, VAR_DIR


class ProcessorSettings(BaseModel):
    app_id: str = "tokentrail-processors"
    attempt_timeout_s: float = 120.0
    group_window_s: float = 60.0
    group_grace_s: float = 10.0
    # The longest the worker's consumer waits on the broker per fetch (ms). A partition its agent has just
    # drained is fetched again only after the request in flight returns (processors/stream/fetch.py), so
    # faust's own 1,500 ms could hold every hop that long; chosen by bench.freshness (docs/performance.md).
    fetch_max_wait_ms: int = 50
    reward_config: Path = DEPLOY_CONFIG_DIR / "reward.yaml"
    credit_config: Path = DEPLOY_CONFIG_DIR / "credit.yaml"
    sample_config: Path = DEPLOY_CONFIG_DIR / "sample.yaml"
    verifiers: list[str] = Field(default_factory=lambda: ["processors.verifiers.answer_match:AnswerMatch"])
    state_dir: Path = VAR_DIR / "processors"
    # What one rollout's open attempts may hold (bytes): an event past it is dead-lettered, so the state
    # and the rollout emitted from it always fit a Kafka record. 0: three quarters of kafka.max_message_bytes.
    max_rollout_bytes: int = 0
    # What any other table may hold for one key (a rollout's joined feedback, a call's or session's rollout
    # ids and waiting feedback, a group slot, a baseline key), in bytes and in things held (issue 29,
    # processors/stream/state_budget.py): an input past either is dead-lettered (StateOverflow), so no
    # changelog entry outgrows what Kafka takes. 0 bytes: a quarter of kafka.max_message_bytes.
    max_key_state_bytes: int = Field(default=0, ge=0)
    max_key_state_items: int = Field(default=1000, ge=0)
    # Static group membership (Kafka group.instance.id), unique per running worker; "{hostname}" is
    # replaced by the host name (a StatefulSet pod's name, a container's id). Empty: dynamic membership.
    instance_id: str = ""
    # The feedback join (issue 21, docs/feedback.md): feedback rewards on tokentrail.rewards, late and
    # unmatched feedback dead-lettered. Off by default: it adds Reward events to an existing topic.
    feedback_join: bool = False
    feedback_config: Path = DEPLOY_CONFIG_DIR / "feedback_reward.yaml"
    # Baselines without siblings (issue 21 item 4, docs/feedback.md): feedback rewards grouped by a key over
    # event-time windows, a running baseline per key where a window is too small; Baseline events on
    # tokentrail.baselines and rewards, credits and samples measured against them. Off by default. It reads
    # feedback rewards, so it is meant with feedback_join on.
    baselines: bool = False
    baseline_config: Path = DEPLOY_CONFIG_DIR / "baseline.yaml"
