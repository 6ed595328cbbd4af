"""The trainer loop: poll a batch, step, publish weights when due, emit the TrainerStep, commit.

Order per batch, chosen so a crash never loses the record of what was trained:
  1. optimizer step on the batch's samples (nothing is committed yet);
  2. every ``steps_per_version`` steps, publish the weights as a new policy version, with the
     batch's next offsets and the step number in the policy's metadata;
  3. emit the TrainerStep event and wait for the broker's acknowledgement;
  4. commit the batch's offsets (trained, filtered and dead-lettered records alike).
A crash before 2 re-reads the batch and re-runs the step from the last published weights (same
step number, same event id when the batch re-forms alike). A crash after 2 restarts from the
published weights and skips to the offsets stored with them, so no batch is trained twice.
With ``steps_per_version`` > 1, the updates of steps after the last publication live only in
memory: a crash loses them while their offsets are already committed.

The loop talks to its surroundings through three small protocols (a batch source, a trainer-step event publisher,
a policy publisher); ``run_training`` wires them to Kafka and the policy store.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trainer_consumer.batching import Batch, FilterConfig
from trainer_consumer.behaviour import BehaviourLogprobs, BehaviourScorer, behaviour_version
from trainer_consumer.events import OffPolicySettings, trainer_resume_record, trainer_step_record
from trainer_consumer.learner import Learner, LearnerConfig, StepResult
from trainer_consumer.losses import loss_denominator
from trainer_consumer.rank_learner import RankLearner
from trainer_consumer.ranks import RankGroup
from trainer_consumer.rollback_resume import RELEASE_SEQUENCE, Resume, RollbackResumer

if TYPE_CHECKING:
    from trainer_consumer.settings import TrainerSettings, TrainerStackSettings

Progress = Callable[[str], None]

# Policy metadata key: the TrainerStep event of the step that published the version (re-emitted on restart).
STEP_EVENT = "step_event"


class BatchSource(Protocol):
    def next_batch(self, idle_timeout_s: float, flush_partial: bool) -> Batch[Any] | None: ...

    def commit(self, batch: Batch[Any]) -> object: ...

    def checkpoint(self, batch: Batch[Any]) -> Any:
        """JSON-able: where reading resumes after this batch (kept with the published policy)."""
        ...


class StepEvents(Protocol):
    def emit_step(self, record: dict[str, Any]) -> None:
        """Returns once the event is durable."""
        ...


class PolicyPublisher(Protocol):
    def publish(self, model: Any, version: int, metadata: dict[str, Any]) -> None: ...


@dataclass
class TrainerState:
    step: int = 0  # optimizer steps completed by this run
    version: int = 0  # policy version of the weights in memory (last published)


@dataclass
class RunSummary:
    steps: int = 0
    samples: int = 0
    tokens: int = 0
    filtered: Counter[str] = field(default_factory=Counter)
    versions_published: list[int] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    stopped: str = ""  # "max_steps" | "idle"


def _quiet(_: str) -> None:
    return None


class TrainingLoop:
    def __init__(self, learner: Learner, source: BatchSource, steps: StepEvents,
                 publisher: PolicyPublisher | None, run_id: str, steps_per_version: int = 1,
                 state: TrainerState | None = None, progress: Progress = _quiet,
                 scorer: BehaviourScorer | None = None,
                 off_policy: OffPolicySettings = OffPolicySettings(),
                 resumer: RollbackResumer | None = None) -> None:
        if steps_per_version < 1:
            raise ValueError("steps_per_version must be at least 1")
        self.learner = learner
        self.source = source
        self.steps = steps
        self.publisher = publisher
        self.run_id = run_id
        self.steps_per_version = steps_per_version
        self.state = state or TrainerState()
        self.progress = progress
        # Recomputes the engine's logprobs under older behaviour versions; without it only samples
        # of the current version are compared (from the step's own forward pass, at no cost).
        self.scorer = scorer
        self.off_policy = dataclasses.replace(off_policy, importance_sampling=learner.cfg.loss.importance_sampling)
        # True while the weights in memory carry steps not yet published (steps_per_version > 1): then
        # they are no version's weights, and no sample's behaviour logprobs come from the step's forward.
        self.unpublished = False
        # Follows the release decisions: a rollback resumes training from the last good version.
        self.resumer = resumer

    def current_version(self) -> int:
        return self.state.version

    def behaviour(self, batch: Batch[Any]) -> BehaviourLogprobs:
        forward_version = None if self.unpublished else self.state.version
        if self.scorer is not None:
            return self.scorer.behaviour(batch.samples, forward_version)
        return BehaviourLogprobs(from_forward=frozenset(
            s.sample_id for s in batch.samples
            if forward_version is not None and behaviour_version(s) == forward_version))

    def process(self, batch: Batch[Any], summary: RunSummary) -> dict[str, Any]:
        """Trains on one batch (if anything in it survived the filters), then records and commits."""
        result: StepResult | None = None
        self._created_at_us: int | None = None
        if self.resumer is not None and self.publisher is not None:
            self._resume_if_rolled_back(summary)
        if batch.samples and loss_denominator(batch.samples, self.learner.cfg.loss.normalization) <= 0:
            # Only reachable with the zero-weight filter off: the whole batch carries no loss weight.
            batch.filtered["zero_weight_batch"] += len(batch.samples)
            batch.samples = []
        if batch.samples:
            try:
                result = self.learner.step(batch.samples, self.behaviour(batch))
            except FloatingPointError:
                batch.filtered["non_finite_gradient"] += len(batch.samples)
                batch.samples = []
        before = self.state.version
        if result is not None:
            self.state.step += 1
            if self.state.step % self.steps_per_version == 0 and self.publisher is not None:
                # The step's event travels with the weights: a crash between publishing and emitting it
                # re-emits it on restart (same event id), so a trained step never goes unrecorded.
                record = self._record(before, before + 1, batch, result)
                self.publisher.publish(self.learner.model, before + 1, {
                    "run_id": self.run_id, "step": self.state.step,
                    "consumed": self.source.checkpoint(batch), STEP_EVENT: record,
                    **(self.resumer.metadata() if self.resumer is not None else {})})
                self.state.version = before + 1
                summary.versions_published.append(self.state.version)
                self.unpublished = False
            else:
                self.unpublished = True
        record = self._record(before, self.state.version, batch, result)
        self.steps.emit_step(record)
        self.source.commit(batch)
        summary.events.append(record)
        summary.filtered.update(batch.filtered)
        if result is not None:
            summary.steps += 1
            summary.samples += result.samples
            summary.tokens += result.tokens
        self.progress(_progress_line(record, result, batch))
        return record

    def _record(self, before: int, after: int, batch: Batch[Any], result: StepResult | None) -> dict[str, Any]:
        record = trainer_step_record(self.run_id, self.state.step, before, after, batch, result,
                                     off_policy=self.off_policy, ranks=self.learner.world_size)
        if self._created_at_us is None:
            self._created_at_us = int(record["created_at_us"])
        else:  # the same step's record before and after publishing is one record
            record["created_at_us"] = self._created_at_us
        return record

    def _resume_if_rolled_back(self, summary: RunSummary) -> None:
        def publish(resume: Resume, metadata: dict[str, Any]) -> int:
            assert self.publisher is not None
            version = self.state.version + 1
            # The event goes out before the weights: a crash in between re-does the resume on restart (the
            # published policy does not yet say it was handled) and re-emits the same event id; the other
            # way round a crash would lose the event.
            record = trainer_resume_record(self.run_id, self.state.step, self.state.version, version, resume,
                                           off_policy=self.off_policy)
            self.steps.emit_step(record)
            summary.events.append(record)
            self.publisher.publish(self.learner.model, version,
                                   {"run_id": self.run_id, "step": self.state.step, **metadata})
            self.state.version = version
            summary.versions_published.append(version)
            self.learner.weights_replaced()
            return version

        assert self.resumer is not None
        self.resumer.check(self.learner.model, self.learner.optimizer, self.state.version, publish)

    def run(self, max_steps: int | None = None, until_idle: bool = False,
            idle_timeout_s: float = 5.0, flush_partial: bool = False) -> RunSummary:
        """Trains until ``max_steps`` optimizer steps, or (``until_idle``) until no sample arrives
        for ``idle_timeout_s``; without either it runs until interrupted. A partial batch is
        trained on once the topic is idle when ``until_idle`` or ``flush_partial``; otherwise the
        loop waits for a full one."""
        summary = RunSummary()
        started = time.perf_counter()
        waiting_since = time.monotonic()
        while max_steps is None or summary.steps < max_steps:
            batch = self.source.next_batch(idle_timeout_s, flush_partial=until_idle or flush_partial)
            if batch is None:
                if until_idle:
                    summary.stopped = "idle"
                    break
                self.progress(f"waiting for samples ({time.monotonic() - waiting_since:.0f} s)")
                continue
            self.process(batch, summary)
            waiting_since = time.monotonic()
        else:
            summary.stopped = "max_steps"
        summary.seconds = time.perf_counter() - started
        return summary


def _progress_line(record: dict[str, Any], result: StepResult | None, batch: Batch[Any]) -> str:
    filtered = f"  filtered {record['filtered_json']}" if batch.filtered else ""
    if result is None:
        return f"step {record['step']:>5}  no trainable samples{filtered}"
    s = result.stats
    m = result.mismatch
    off_policy = (f"  mismatch {m.mean_abs:.4f}/{m.max_abs:.3f} >{m.bound:g} {m.beyond_fraction:.3f} ({m.tokens} tok)"
                  if m.tokens else "")
    if record["importance_sampling"] != "none":
        off_policy += f"  {record['importance_sampling']} cut {s.importance_truncated_fraction:.3f}"
    if record["stale_masked_tokens"]:
        off_policy += f"  stale masked {record['stale_masked_tokens']} tok"
    version = (f"v{record['policy_version_before']}->v{record['policy_version_after']}"
               if record["policy_version_after"] != record["policy_version_before"]
               else f"v{record['policy_version_before']}")
    return (f"step {record['step']:>5}  {version:<9} {result.samples:>4} samples {result.tokens:>7,} tok  "
            f"loss {s.loss:+.4f}  ratio {s.mean_ratio:.3f}  clip {s.clip_fraction:.3f}  "
            f"kl {s.approx_kl:+.4f}  |g| {result.grad_norm:.3f}  {result.seconds:.2f} s{off_policy}{filtered}")


# ---------------------------------------------------------------- wiring: Kafka + policy store


def learner_config(settings: TrainerStackSettings, options: TrainOptions) -> LearnerConfig:
    """The options' learner, else one from the trainer settings (every rank builds the same)."""
    from trainer_consumer.losses import LossConfig
    from trainer_consumer.settings import resolve_importance_sampling

    ts = settings.trainer
    return options.learner or LearnerConfig(
        learning_rate=ts.learning_rate, mismatch_bound=ts.mismatch_bound,
        loss=LossConfig(importance_sampling=resolve_importance_sampling(ts.importance_sampling, options.upstream),
                        importance_cap=ts.importance_cap))


def consumed_metadata(policy: Any) -> dict[str, Any]:
    """What this run stored with the weights it starts from ({} for the base model or another run's)."""
    return policy.metadata if policy.step else {}


@dataclass(frozen=True)
class TrainOptions:
    """What ``tokentrail train`` (or the demo job) asks for; None fields come from settings."""

    max_steps: int | None = None
    until_idle: bool = False
    idle_timeout_s: float = 5.0
    flush_partial: bool = False  # keep running, but train on a partial batch when the topic is idle
    batch_size: int = 8
    max_batch_tokens: int | None = None
    run_id: str | None = None  # default: the consumer group id
    group_id: str | None = None
    filters: FilterConfig | None = None
    learner: LearnerConfig | None = None
    steps_per_version: int | None = None
    model_dir: Path | None = None
    checkpoint_dir: Path | None = None
    samples_topic: str | None = None
    steps_topic: str | None = None
    dead_letter_topic: str | None = None
    torch_threads: int | None = None  # None: torch's default (all cores)
    # The engine upstream the samples came from ("embedded" | "vllm"): decides importance_sampling "auto".
    upstream: str = "embedded"
    # Follow this release track's decisions (the served model name): a rollback resumes from the last good
    # version (trainer_consumer/rollback_resume.py). None: do not follow.
    release_model: str | None = None
    release_topic: str | None = None


def reader_membership(ts: TrainerSettings, group_id: str, group: RankGroup | None) -> dict[str, Any]:
    """Consumer settings for the samples reader's membership of its Kafka group.

    On several ranks the reader (rank 0) is a static member (``group.instance.id``, one per group: the
    rank design has one reader per group). ``torchrun`` restarts a group by stopping the surviving ranks
    with SIGTERM, so the old reader never leaves the group; as a static member the restarted reader takes
    its place back at once, where a new dynamic member would wait for the old one's session to expire."""
    session_ms = int(ts.session_timeout_s * 1000)
    conf: dict[str, Any] = {"session.timeout.ms": session_ms, "heartbeat.interval.ms": max(session_ms // 4, 500)}
    if group is not None and group.distributed:
        conf["group.instance.id"] = f"{group_id}.rank-0"
    return conf


def run_training(settings: TrainerStackSettings, options: TrainOptions = TrainOptions(),
                 progress: Progress = _quiet, group: RankGroup | None = None) -> RunSummary:
    """Consume samples, train, publish policy versions and emit TrainerStep events, in-process.

    With a ``group`` of several ranks this is rank 0's part: the only reader of the samples topic, it
    hands every global step's samples out to the ranks (``rank_learner.RankLearner``), and alone
    publishes, emits and commits once every rank has finished the step; the other ranks run
    ``rank_training.follow_steps``."""
    from models.policy_store import PolicyStore
    from schemas import topics
    from schemas.kafka import config as kafka_config
    from trainer_consumer.batching import BatchBuilder
    from trainer_consumer.dataset import SampleStream
    from trainer_consumer.policy import StorePublisher, load_policy, state_dict_loader
    from trainer_consumer.step_publisher import StepPublisher

    if options.torch_threads:
        import torch

        torch.set_num_threads(options.torch_threads)
    ts = settings.trainer
    group_id = options.group_id or ts.group_id
    run_id = options.run_id or group_id
    learner_cfg = learner_config(settings, options)
    filter_cfg = options.filters or FilterConfig.from_settings(ts)
    store = PolicyStore(options.checkpoint_dir or ts.checkpoint_dir)
    model_dir = options.model_dir or settings.model.dir

    progress(f"loading the policy (model {model_dir}, policies {store.root})")
    policy = load_policy(model_dir, store, run_id, progress=progress)
    consumed = policy.metadata.get("consumed") if policy.step else None
    progress(f"policy version {policy.version}, step {policy.step}; run {run_id}, group {group_id}")
    steps = StepPublisher(kafka_config.producer_config(settings.kafka),
                          options.steps_topic or topics.TRAINER_STEPS_TOPIC,
                          options.dead_letter_topic or topics.DEAD_LETTER_TOPIC)
    if STEP_EVENT in consumed_metadata(policy):
        # The step that published these weights: re-emitted (the same event id) in case a crash came between
        # publishing and emitting; sinks keep one.
        steps.emit_step(policy.metadata[STEP_EVENT])
    if filter_cfg.vocab_size is None:
        vocab = int(policy.model.get_input_embeddings().num_embeddings)
        filter_cfg = dataclasses.replace(filter_cfg, vocab_size=vocab)
    state = TrainerState(step=policy.step, version=policy.version)
    builder: BatchBuilder[Any] = BatchBuilder(options.batch_size, options.max_batch_tokens,
                                              filter_cfg.build(), staleness=filter_cfg.staleness())
    stream = SampleStream(kafka_config.consumer_config(settings.kafka, group_id,
                                                       **reader_membership(ts, group_id, group)),
                          options.samples_topic or topics.SAMPLES_TOPIC, builder,
                          current_version=lambda: state.version, dead_letter=steps.dead_letter,
                          start_after=consumed)
    scorer = BehaviourScorer(policy.model, state_dict_loader(model_dir, store),
                             cache_versions=ts.behaviour_cache_versions, layout=learner_cfg.layout,
                             pad_id=policy.pad_id, micro_batch_tokens=learner_cfg.micro_batch_tokens)
    off_policy = OffPolicySettings(max_staleness=filter_cfg.max_staleness, stale_rule=filter_cfg.stale_rule)
    progress(f"off-policy: importance sampling {learner_cfg.loss.importance_sampling} (upstream "
             f"{options.upstream}), staleness bound {filter_cfg.max_staleness} ({filter_cfg.stale_rule}), "
             f"mismatch bound {learner_cfg.mismatch_bound:g}")
    follower, resumer = None, None
    if options.release_model:
        from schemas.kafka.release_follower import ReleaseFollower

        follower = ReleaseFollower(settings.kafka, options.release_model,
                                   options.release_topic or topics.RELEASE_DECISIONS_TOPIC, reader="trainer").start()
        follower.caught_up.wait(30.0)  # a rollback written while the trainer was down applies before its first step
        resumer = RollbackResumer(follower.applied, state_dict_loader(model_dir, store),
                                  handled_sequence=int(policy.metadata.get(RELEASE_SEQUENCE, -1)), progress=progress)
    learner = (RankLearner(policy.model, learner_cfg, group, pad_id=policy.pad_id) if group is not None
               else Learner(policy.model, learner_cfg, pad_id=policy.pad_id))
    loop = TrainingLoop(learner, stream, steps,
                        StorePublisher.from_settings(store, ts), run_id,
                        steps_per_version=options.steps_per_version or ts.steps_per_version,
                        state=state, progress=progress, scorer=scorer, off_policy=off_policy, resumer=resumer)
    try:
        return loop.run(options.max_steps, options.until_idle, options.idle_timeout_s, options.flush_partial)
    finally:
        try:
            if isinstance(learner, RankLearner):
                learner.stop_followers()  # raises when a rank has died: the consumer is closed all the same
        finally:
            stream.close()
            steps.close()
            if follower is not None:
                follower.close()
