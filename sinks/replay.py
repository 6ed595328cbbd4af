"""`tokentrail replay`: re-derive rewards, credits and samples under new configurations from the raw
scores and rollouts stored in ClickHouse, without running any environment or verifier.

The derivation is the processors' own ``rederive`` (the function the stream processors call), so a
replay under the running configuration reproduces the stored events exactly (same ids, deduplicated),
and a replay under a new one adds events carrying the new config ids next to the old ones, which stay.
Output goes to the Kafka topics (default: the sink stores them and trainers can read them), straight
into ClickHouse, or nowhere (``--dry-run``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from clickhouse_connect.driver.client import Client

from processors.baselines.config import BaselineConfig
from processors.baselines.derive import derive_window
from processors.baselines.keys import rollout_key
from processors.baselines.members import first_call_key, is_baseline_input, member_of, reward_of_attempt
from processors.baselines.windows import Member, batch_windows
from processors.errors import InvalidEvent, PipelineInputError
from processors.feedback.config import FeedbackRewardConfig
from processors.feedback.replay import event_time_rewards, replay_reward_record
from processors.feedback.validate import check_feedback
from processors.pipeline import StageConfigs, rederive
from schemas.ids import event_id
from schemas.kafka.config import KafkaSettings
from sinks.audit_forgotten import forgotten_ids, forgotten_requests
from sinks.feedback_store import components, load_feedback, load_feedback_rewards, load_rollout_refs
from sinks.rows import Record, from_row
from sinks.store import CallTokenCache, load_records, load_rollouts, select_rows

Event = tuple[str, Record]
GROUP_BATCH = 200


@dataclass
class ReplayResult:
    configs: dict[str, str]  # stage -> config id
    groups: int = 0
    events: list[Event] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (group event id, reason)
    rewritten_scores: list[str] = field(default_factory=list)  # score ids with several contents
    # Rollouts whose content was forgotten (issue 31): rollout event id -> the forget request; their groups
    # cannot be re-derived (samples need the tokens) and are skipped with that reason.
    forgotten_rollouts: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return dict(Counter(name for name, _ in self.events))


def first_scores(client: Client, rollout_event_ids: list[str]) -> tuple[list[Record], list[str]]:
    """One record per score id: the first stored content (raw scores never change; a later rewrite is
    the audit's business, not the replay's input). Also returns the ids that were rewritten."""
    rows = select_rows(
        client,
        "scores",
        "rollout_event_id IN {ids:Array(String)}",
        {"ids": rollout_event_ids},
        order_by="ingested_at, content_hash",
    )
    by_id: dict[str, Record] = {}
    rewritten = set()
    for row in rows:
        if row["event_id"] in by_id:
            if by_id[row["event_id"]]["content_hash"] != row["content_hash"]:
                rewritten.add(row["event_id"])
            continue
        by_id[row["event_id"]] = row
    return [from_row("scores", row) for row in by_id.values()], sorted(rewritten)


def _group_batches(client: Client, group_ids: list[str] | None) -> Iterator[list[Record]]:
    where, params = "", {}
    if group_ids:
        where, params = "group_id IN {ids:Array(String)}", {"ids": group_ids}
    groups = load_records(client, "groups", where, params, order_by="created_at_us, event_id")
    for i in range(0, len(groups), GROUP_BATCH):
        yield groups[i : i + GROUP_BATCH]


def replay(
    client: Client,
    configs: StageConfigs,
    group_ids: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ReplayResult:
    """Derive events for every stored group (or the given group ids) under ``configs``."""
    result = ReplayResult({"reward": configs.reward.id, "credit": configs.credit.id, "sample": configs.sample.id})
    cache = CallTokenCache(client)
    all_forgotten = forgotten_ids(client, "rollouts", "event_id", forgotten_requests(client))
    for batch in _group_batches(client, group_ids):
        member_ids = sorted({e for g in batch for e in g["rollout_event_ids"]})
        forgotten = {i: all_forgotten[i] for i in member_ids if i in all_forgotten}
        result.forgotten_rollouts.update(forgotten)
        readable = [i for i in member_ids if i not in forgotten]
        rollouts = {
            r["event_id"]: r
            for r in load_rollouts(client, "event_id IN {ids:Array(String)}", {"ids": readable}, cache=cache)
        }
        scores, rewritten = first_scores(client, member_ids)
        result.rewritten_scores += rewritten
        for group in batch:
            members = [rollouts[e] for e in group["rollout_event_ids"] if e in rollouts]
            gone = sorted({forgotten[e] for e in group["rollout_event_ids"] if e in forgotten})
            if gone:
                result.skipped.append((group["event_id"], f"content forgotten by request {', '.join(gone)}"))
                continue
            if len(members) != len(group["rollout_event_ids"]):
                result.skipped.append((group["event_id"], "rollouts of the group are not all stored"))
                continue
            try:
                derived = rederive(group, members, scores, configs.reward, configs.credit, configs.sample)
            except PipelineInputError as exc:
                result.skipped.append((group["event_id"], str(exc)))
                continue
            result.events += [e for e in derived.events() if e[0] != "Score"]
            result.groups += 1
        if progress:
            progress(f"replay: {result.groups} groups, {len(result.events)} events, {len(result.skipped)} skipped")
    return result


def publish(events: list[Event], kafka: KafkaSettings, topic_of: dict[str, str] | None = None) -> int:
    """Produce the events to their topics (keyed like the processors key them); returns how many."""
    from confluent_kafka import KafkaException, Producer

    from schemas import topics
    from schemas.kafka import config as kafka_config
    from schemas.kafka.registry_framing import kafka_codec

    codec = kafka_codec(kafka.schema_registry_url)
    topic_of = topic_of or {name: spec.name for spec in topics.ALL_TOPICS for name in spec.value_schemas}
    producer = Producer(kafka_config.producer_config(kafka))
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for name, record in events:
        key = (record["rollout_ids"][0] if name == "Sample" else record["key"] if name == "Baseline"
               else record["rollout_id"])
        producer.produce(topic_of[name], value=codec.encode(name, record), key=key.encode(), on_delivery=on_delivery)
        producer.poll(0)
    remaining = producer.flush(60)
    if remaining or errors:
        raise KafkaException(f"{remaining} replayed events not acknowledged; errors: {errors[:3]}")
    return len(events)


# ---- feedback rewards (issue 21) ------------------------------------------------------------------


@dataclass(frozen=True)
class FeedbackSideBySide:
    """One rollout attempt: the stream's feedback reward(s) beside the one replay derives."""

    rollout_id: str
    attempt_id: str
    originals: list[Record]  # the stored feedback rewards of this attempt (any feedback config)
    replayed: Record  # the replayed Reward event (``replay_reward_record``)

    @property
    def late_admitted(self) -> list[str]:
        """Feedback replay admits that no original admitted (recorded late by the stream)."""
        seen = {fid for o in self.originals for fid in components(o).get("admitted", [])}
        return [fid for fid in components(self.replayed)["admitted"] if fid not in seen]

    @property
    def changed(self) -> bool:
        return any((o["filtered"], o["reward"]) != (self.replayed["filtered"], self.replayed["reward"])
                   for o in self.originals) or not self.originals


@dataclass
class FeedbackReplay:
    config_id: str
    rows: list[FeedbackSideBySide] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)  # stored feedback that is not valid: not used

    @property
    def events(self) -> list[Event]:
        return [("Reward", row.replayed) for row in self.rows]


def replay_feedback(client: Client, cfg: FeedbackRewardConfig,
                    progress: Callable[[str], None] | None = None) -> FeedbackReplay:
    """Every stored rollout's feedback reward re-derived from all stored feedback by event time
    (``event_time_rewards``: late feedback within its kind's wait counts), beside the stored originals."""
    refs = load_rollout_refs(client)
    feedback, invalid = [], []
    for item in load_feedback(client):  # the sink stores what the join refused as invalid: replay skips it too
        try:
            check_feedback(item)
            feedback.append(item)
        except InvalidEvent:
            invalid.append(item["event_id"])
    if progress:
        progress(f"replay --feedback: {len(refs)} completed rollouts, {len(feedback)} feedback events "
                 f"({len(invalid)} invalid skipped)")
    originals: dict[str, list[Record]] = {}
    for reward in load_feedback_rewards(client):
        originals.setdefault(reward["rollout_id"], []).append(reward)
    result = FeedbackReplay(cfg.id, invalid=invalid)
    for ref, reward in zip(refs, event_time_rewards(refs, feedback, cfg), strict=True):
        mine = [o for o in originals.get(ref.rollout_id, [])
                if o["event_id"] == event_id("feedback_reward", ref.rollout_event_id, o["reward_config_id"])]
        result.rows.append(FeedbackSideBySide(ref.rollout_id, ref.attempt_id, mine, replay_reward_record(reward)))
    return result


def format_feedback_replay(result: FeedbackReplay) -> str:
    """The side-by-side table: original reward(s) and config, replayed reward, late feedback it admits."""
    def value(reward: Record) -> str:
        return "filtered" if reward["filtered"] else f"{reward['reward']:.4g}"

    lines = [f"feedback config {result.config_id} (replay); rollouts {len(result.rows)}, "
             f"changed {sum(r.changed for r in result.rows)}; invalid feedback skipped {len(result.invalid)}",
             f"{'rollout':<28} {'attempt':<10} {'original (config)':<30} {'replayed':<10} late feedback admitted"]
    for row in result.rows:
        original = ", ".join(f"{value(o)} ({o['reward_config_id']})" for o in row.originals) or "none"
        late = ", ".join(row.late_admitted) or "-"
        lines.append(f"{row.rollout_id:<28} {row.attempt_id:<10} {original:<30} {value(row.replayed):<10} {late}")
    return "\n".join(lines)


# ---- baselines without siblings (issue 21 item 4) ------------------------------------------------------


@dataclass
class BaselineReplay:
    config_id: str
    members: int = 0  # rollout attempts measured (with a feedback reward and a key)
    unpaired: int = 0  # completed attempts with no feedback reward the baselines read
    events: list[Event] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return dict(Counter(name for name, _ in self.events))


def replay_baselines(client: Client, cfg: BaselineConfig, configs: StageConfigs,
                     progress: Callable[[str], None] | None = None) -> BaselineReplay:
    """Every stored completed attempt with a stream feedback reward, grouped and measured as the stream does
    (``batch_windows``: all members at once, in event-time order), with the Baseline events and the rewards,
    credits and samples measured against them. Under the stream's configurations and with no member late in
    the stream, the events and ids equal the stream's (the sink deduplicates them)."""
    result = BaselineReplay(cfg.id)
    rewards = [r for r in load_feedback_rewards(client) if is_baseline_input(r, cfg)]
    by_rollout: dict[str, list[Record]] = {}
    for reward in rewards:
        by_rollout.setdefault(reward["rollout_id"], []).append(reward)
    rollouts = load_rollouts(client, "status = 'COMPLETE' AND counted AND rollout_id IN {ids:Array(String)}",
                             {"ids": sorted(by_rollout)}) if by_rollout else []
    first_keys: dict[tuple[str, str], str | None] = {}
    if cfg.key.by == "first_user_message" and rollouts:
        for call in load_records(client, "calls", "call_index = 0 AND rollout_id IN {ids:Array(String)}",
                                 {"ids": sorted(by_rollout)}):
            first_keys[(call["rollout_id"], call["attempt_id"])] = first_call_key(call, cfg)
    members: dict[str, list[Member]] = {}
    inputs: dict[str, Record] = {}
    by_event: dict[str, Record] = {}
    for rollout in rollouts:
        reward = next((r for r in by_rollout[rollout["rollout_id"]] if reward_of_attempt(r, rollout["event_id"])), None)
        key = rollout_key(rollout, cfg.key, first_keys.get((rollout["rollout_id"], rollout["attempt_id"])))
        if reward is None or key is None:
            result.unpaired += reward is None
            continue
        members.setdefault(key, []).append(member_of(rollout, reward))
        inputs[reward["event_id"]] = reward
        by_event[rollout["event_id"]] = rollout
    result.members = sum(len(m) for m in members.values())
    if progress:
        progress(f"replay --baselines: {result.members} rewarded rollouts in {len(members)} keys "
                 f"({result.unpaired} completed attempts without a feedback reward)")
    for window in batch_windows(members, cfg):
        result.events += derive_window(window, by_event, inputs, configs.credit, configs.sample,
                                       skip_zero=cfg.skip_zero_advantage)
    return result
