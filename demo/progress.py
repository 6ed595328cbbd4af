"""Live progress of the online loop, read from the topics themselves (the source of truth).

Joins rewards to their rollouts' policy versions, and counts trainer steps, so the demo can show
reward against policy version while it trains. Runs on a background thread with its own consumer.
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

from schemas import topics
from schemas.codec import DecodeError, get_codec
from schemas.kafka import config as kafka_config
from tokentrail.settings import Settings
from trainer_consumer.step_audit import exactly_once


@dataclass
class VersionStats:
    rewards: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else float("nan")


class ProgressTracker:
    def __init__(self, settings: Settings) -> None:
        group = f"tokentrail-demo-progress-{uuid.uuid4().hex}"
        self._settings, self._group = settings, group
        self._offsets_client: Consumer | None = None
        self._consumer = Consumer(kafka_config.consumer_config(settings.kafka, group,
                                                               **{"auto.offset.reset": "earliest"}))
        self._consumer.subscribe([topics.ROLLOUTS_TOPIC, topics.REWARDS_TOPIC, topics.TRAINER_STEPS_TOPIC,
                                  topics.SAMPLES_TOPIC])
        self._codec = get_codec()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._version_of: dict[str, int] = {}
        self._reward_of: dict[str, float] = {}
        self.rollouts = self.incomplete = self.samples = 0
        self.trainer_steps = 0
        self.last_loss = float("nan")
        self.policy_version = 0
        # Issue 19: engine/trainer logprob mismatch, importance-weight truncation, staleness, summed over steps.
        self.mismatch_tokens = self.mismatch_beyond = self.importance_tokens = self.importance_truncated = 0
        self.mismatch_abs_sum = self.mismatch_max_abs = 0.0
        self.stale_dropped = self.stale_masked_tokens = 0
        self.importance_sampling = ""
        self._seen: set[str] = set()
        self._sample_ids: list[str] = []
        self._steps: list[dict] = []  # TrainerStep records: which samples each step trained or dropped
        self._thread = threading.Thread(target=self._run, name="demo-progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._consumer.close()
        if self._offsets_client is not None:
            self._offsets_client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self._consumer.consume(500, timeout=0.5):
                if message.error() or message.value() is None:
                    continue
                try:
                    name, record = self._codec.decode(message.value())
                except DecodeError:
                    continue
                with self._lock:
                    self._apply(name, record)

    def _apply(self, name: str, record: dict) -> None:
        if record["event_id"] in self._seen:  # at-least-once delivery: count each event once
            return
        self._seen.add(record["event_id"])
        if name == "CompletedRollout":
            if record["status"] != "COMPLETE":
                self.incomplete += 1
                return
            self.rollouts += 1
            self._version_of[record["rollout_id"]] = max(record["policy_versions"] or [0])
        elif name == "Reward":
            self._reward_of[record["rollout_id"]] = record["raw_reward"]
        elif name == "Sample":
            self.samples += 1
            self._sample_ids.append(record["event_id"])
        elif name == "TrainerStep":
            self.trainer_steps += 1
            self._steps.append(record)
            self.last_loss = record["loss"]
            self.policy_version = max(self.policy_version, record["policy_version_after"])
            n = record["mismatch_tokens"]
            self.mismatch_tokens += n
            self.mismatch_abs_sum += record["mismatch_mean_abs"] * n
            self.mismatch_beyond += round(record["mismatch_beyond_fraction"] * n)
            self.mismatch_max_abs = max(self.mismatch_max_abs, record["mismatch_max_abs"])
            self.importance_tokens += record["importance_tokens"]
            self.importance_truncated += record["importance_truncated"]
            self.importance_sampling = record["importance_sampling"]
            self.stale_dropped += len(record["stale_dropped_ids"])
            self.stale_masked_tokens += record["stale_masked_tokens"]

    def topic_counts(self, names: tuple[str, ...] = (topics.CALLS_TOPIC, topics.ENV_TOPIC, topics.ROLLOUTS_TOPIC,
                                                     topics.SAMPLES_TOPIC, topics.DEAD_LETTER_TOPIC)) -> str:
        """Records on each stage's topic (end offsets): where a stuck pipeline stops growing."""
        # A client of its own: the tracker's consumer is busy in consume() on the other thread, and
        # metadata calls on it from here can block behind that.
        if self._offsets_client is None:
            self._offsets_client = Consumer(kafka_config.consumer_config(self._settings.kafka, self._group))
        client = self._offsets_client
        counts = []
        for name in names:
            try:
                meta = client.list_topics(name, timeout=5).topics[name]
                total = sum(client.get_watermark_offsets(TopicPartition(name, p), timeout=5)[1]
                            for p in meta.partitions)
            except Exception as exc:  # a diagnostic line must never stop the demo
                counts.append(f"{name.removeprefix('tokentrail.')}=? ({type(exc).__name__})")
                continue
            counts.append(f"{name.removeprefix('tokentrail.')}={total}")
        return "records on topics: " + " ".join(counts)

    def drained(self, rollouts_finished: int) -> bool:
        """Everything the workload finished has gone through: ``rollouts_finished`` rollouts seen, every COMPLETE
        one rewarded, and every sample seen accounted for by a TrainerStep (trained, dropped as stale or
        counted by a filter; ``trainer_consumer.step_audit``, the check the demo ends with)."""
        with self._lock:
            if self.rollouts + self.incomplete < rollouts_finished:
                return False
            if any(rollout_id not in self._reward_of for rollout_id in self._version_of):
                return False
            return exactly_once(self._steps, self._sample_ids).samples_lost == 0

    def reward_by_version(self) -> dict[int, VersionStats]:
        with self._lock:
            stats: dict[int, VersionStats] = defaultdict(VersionStats)
            for rollout_id, reward in self._reward_of.items():
                version = self._version_of.get(rollout_id)
                if version is not None:
                    stats[version].rewards.append(reward)
            return dict(sorted(stats.items()))

    def off_policy(self) -> dict[str, object]:
        """The run's engine/trainer logprob mismatch, importance correction and staleness, from the steps."""
        with self._lock:
            n = self.mismatch_tokens
            return {
                "mismatch_tokens": n,
                "mismatch_mean_abs": round(self.mismatch_abs_sum / n, 6) if n else None,
                "mismatch_max_abs": round(self.mismatch_max_abs, 6) if n else None,
                "mismatch_beyond_fraction": round(self.mismatch_beyond / n, 6) if n else None,
                "importance_sampling": self.importance_sampling or None,
                "importance_truncated_fraction": (round(self.importance_truncated / self.importance_tokens, 6)
                                                  if self.importance_tokens else None),
                "stale_samples_dropped": self.stale_dropped,
                "stale_tokens_masked": self.stale_masked_tokens,
            }

    def line(self) -> str:
        by_version = self.reward_by_version()
        recent = list(by_version.items())[-3:]
        shown = "  ".join(f"v{v}: {s.mean:.2f} (n={len(s.rewards)})" for v, s in recent)
        return (f"rollouts {self.rollouts} (incomplete {self.incomplete})  samples {self.samples}  "
                f"trainer steps {self.trainer_steps} (loss {self.last_loss:.4f})  policy v{self.policy_version}"
                f"  reward by version: {shown or '-'}")


def version_bands(by_version: dict[int, VersionStats], bands: int = 5) -> list[tuple[int, int, float, int]]:
    """(first version, last version, mean reward, rollouts) for about ``bands`` equal slices of versions.

    Each policy version serves only a few rollouts in a short run, so single versions are noisy. A last
    slice of fewer than half the others' versions joins the one before it: the first and last bands are
    what ``reward_improved`` compares, and one or two versions alone would decide it on a handful of rollouts.
    """
    versions = [v for v, s in by_version.items() if s.rewards]
    if not versions:
        return []
    size = max(1, -(-len(versions) // bands))
    chunks = [versions[i:i + size] for i in range(0, len(versions), size)]
    if len(chunks) > 1 and 2 * len(chunks[-1]) < size:
        chunks[-2:] = [chunks[-2] + chunks[-1]]
    out = []
    for chunk in chunks:
        rewards = [r for v in chunk for r in by_version[v].rewards]
        out.append((chunk[0], chunk[-1], sum(rewards) / len(rewards), len(rewards)))
    return out
