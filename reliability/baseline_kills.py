"""Fault (l): kill -9 of a worker running the baseline agents, mid-stream, then restarted.

Organic-session rollouts (no group, no siblings) with feedback on them go through a real processors worker
with the feedback join and the baselines on (docs/feedback.md). The worker is killed -9 twice: once while
the feedback rewards are coming out and the baselines only hold members (pairing entries, open windows),
once after the first baseline windows have closed and before the rest have. A restarted worker resumes
from its changelogged tables and committed offsets.

A clean run is what the pure core derives from the same inputs: the feedback join's rewards
(``FeedbackJoin``), every key's windows (``batch_windows``, the replay's computation) and their Baseline,
Reward, Credit and Sample events (``derive_window``). The killed run must give exactly those: no id
missing, none unexpected, every copy of an id identical to the clean run's (a re-emitted window after a
restart carries the same deterministic id and content, and consumers keep it once), and no member recorded
late. The baseline watermark lag (20 s) is wider than the inputs' event-time spread, so in a clean run no
member is late however the partitions interleave; stream time pauses while the worker is down (a
restarted worker seeds its clocks from the event times its table entries stored) and runs on with the wall
clock while it is up, so the lag must also cover the time the members take through the feedback join.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from processors.assembler import RolloutAssembly
from processors.baselines.config import BaselineConfig
from processors.baselines.derive import derive_window
from processors.baselines.keys import rollout_key
from processors.baselines.members import first_call_key, member_of, reward_of_attempt
from processors.baselines.windows import Member, batch_windows
from processors.config import load_config
from processors.feedback.config import FeedbackRewardConfig, load_feedback_config
from processors.feedback.join import FeedbackJoin, FeedbackReward, reward_record, rollout_ref
from processors.pipeline import StageConfigs
from producers.gateway.records import request_json
from reliability.pipeline import Collected, Event, Pipeline, Record, compare
from reliability.results import FaultResult
from schemas.feedback import FeedbackValue, build_feedback
from testkit.stages import AttemptSpec, attempt_events, growing_turns
from tokentrail.settings import Settings

Progress = Callable[[str], None]
S = 1_000_000
T0_US = 1_700_000_000_000_000  # a multiple of the window size
NAMES = ("Baseline", "Reward", "Credit", "Sample")
# Every stage of the join and the baselines that could record an input it did not measure.
UNMEASURED_STAGES = ("baseline", "baseline_late", "baseline_pair", "baseline_rewards", "feedback_late",
                     "feedback_join", "feedback_router")

# The feedback join's lag (12 s) is wider than the inputs' event-time spread (6 s): a rollout's window
# cannot be closed by stream time before its own feedback arrives, however the partitions interleave.
FEEDBACK = {"name": "reliability-baseline-kills", "wait_s": {k: 1 for k in ("BINARY", "RATING", "OUTCOME",
                                                                              "TASK_OUTCOME", "TEXT")},
            "watermark_lag_s": 12, "match_wait_s": 120, "closed_retention_s": 600, "combine": "mean"}
# Windows of 2 s over the 6 s: three windows per key, GROUP where a key has three sessions in a window,
# RUNNING (against the key's ewma, with a prior) where it has fewer. The lag (20 s) is wider than the spread
# plus the members' way through the join: stream time runs on with the wall clock between records, and with
# 8 s a member that took more than ~2 s longer than its peers through a loaded broker came late (seen once in
# the suite on 2026-12-05: 9 members dead-lettered window_closed after the last restart).
BASELINE = {"name": "reliability-baseline-kills", "window": {"kind": "tumbling", "size_s": 2},
            "min_group_size": 3, "watermark_lag_s": 20, "group": {"baseline": "leave_one_out", "scale_by_std": True},
            "running": {"method": "ewma", "alpha": 0.3, "prior_mean": 0.5}, "clip": [-5.0, 5.0]}
SPREAD_S = 6.0
TEMPLATES = ('What is "{}"?', "Fix the failing test in {}.py line 7", "Summarize the ticket {}")


@dataclass(frozen=True)
class Inputs:
    events: list[Event]  # calls and env events of every session
    feedback: list[Record]


def organic_session(name: str, message: str, at_us: int, seed: int) -> list[Event]:
    """One organic session's rollout (``session-<name>``, two calls) whose first user message is ``message``."""
    rng = np.random.default_rng(seed)
    turns = growing_turns(rng, 2, 12, 4, 4, vocab=900, texts=["tool call", "answer"])
    events = attempt_events(AttemptSpec(f"session-{name}", "a1", turns, task_input={}, t0_us=at_us))
    for kind, record in events:
        if kind == "CallRecord":
            record["session_id"] = f"sess-{name}"
            record["request_json"] = request_json("POST", "/v1/chat/completions", "", {}, {  # as the gateway records it
                "model": "m", "messages": [{"role": "user", "content": message}]})
    return events


def session_feedback(name: str, at_us: int, rng: np.random.Generator) -> list[Record]:
    """A thumbs on the session's rollout, and for some a 1-5 rating too (the join takes their mean)."""
    def one(kind: str, value: FeedbackValue, offset_us: int) -> Record:
        return build_feedback(source="reliability", target_kind="ROLLOUT", target_id=f"session-{name}", kind=kind,
                              value=value, event_time_us=at_us + offset_us, created_at_us=at_us + offset_us + 5,
                              source_feedback_id=f"{name}-{kind}")
    out = [one("BINARY", FeedbackValue(binary=bool(rng.random() < 0.5)), 300_000)]
    if rng.random() < 0.4:
        out.append(one("RATING", FeedbackValue(rating=float(rng.integers(1, 6)), rating_min=1.0, rating_max=5.0),
                       600_000))
    return out


def workload(sessions: int, seed: int) -> Inputs:
    """``sessions`` organic sessions of three first-message templates, spread over ``SPREAD_S`` of event time."""
    rng = np.random.default_rng(seed)
    events: list[Event] = []
    feedback: list[Record] = []
    for n in range(sessions):
        name = f"bk{seed}-{n}"
        at_us = T0_US + round(float(rng.uniform(0.0, SPREAD_S)) * S)
        message = TEMPLATES[n % len(TEMPLATES)].format(f"item-{n}")
        events += organic_session(name, message, at_us, seed * 1000 + n)
        feedback += session_feedback(name, at_us, rng)
    return Inputs(events, feedback)


def clean_run(inputs: Inputs, feedback_cfg: FeedbackRewardConfig, cfg: BaselineConfig,
              stages: StageConfigs) -> dict[str, dict[str, Record]]:
    """Event id -> record of what the pure core derives: feedback rewards, then every window's events."""
    rollouts = completed_rollouts(inputs.events)
    rewards: dict[str, Record] = {}
    for rollout in rollouts.values():  # one join per rollout id, as the stream keys it
        join = FeedbackJoin(feedback_cfg)
        produced = join.add_rollout(rollout_ref(rollout))
        for item in sorted(inputs.feedback, key=lambda f: f["event_time_us"]):
            if item["target_id"] == rollout["rollout_id"]:
                produced += join.add_feedback(item)
        produced += join.tick(T0_US + 3600 * S)
        if any(not isinstance(o, FeedbackReward) for o in produced):
            raise AssertionError(f"the workload's feedback on {rollout['rollout_id']} is not all admitted")
        rewards.update((r["event_id"], r) for r in map(reward_record, produced))
    first_keys = {(c["rollout_id"], c["attempt_id"]): first_call_key(c, cfg) for name, c in inputs.events
                  if name == "CallRecord" and c["call_index"] == 0}
    members: dict[str, list[Member]] = {}
    for rollout in rollouts.values():
        reward = next(r for r in rewards.values() if reward_of_attempt(r, rollout["event_id"]))
        if reward["filtered"]:
            continue
        key = rollout_key(rollout, cfg.key, first_keys[(rollout["rollout_id"], rollout["attempt_id"])])
        members.setdefault(str(key), []).append(member_of(rollout, reward))
    by_event = {r["event_id"]: r for r in rollouts.values()}
    out: dict[str, dict[str, Record]] = {name: {} for name in NAMES}
    out["Reward"].update(rewards)
    for window in batch_windows(members, cfg):
        for name, record in derive_window(window, by_event, rewards, stages.credit, stages.sample,
                                          skip_zero=cfg.skip_zero_advantage):
            out[name][record["event_id"]] = record
    return out


def completed_rollouts(events: list[Event]) -> dict[str, Record]:
    """Event id -> the rollout the assembler emits for each attempt."""
    states: dict[str, RolloutAssembly] = {}
    out: dict[str, Record] = {}
    for name, record in events:
        state = states.setdefault(record["rollout_id"], RolloutAssembly(record["rollout_id"]))
        for rollout in state.accept(name, record).rollouts:
            out[rollout["event_id"]] = rollout
    return out


def baseline_records(got: Collected, expected: dict[str, dict[str, Record]], config_ids: set[str]) -> Collected:
    """The outputs of the feedback join and the baselines among everything the worker produced (the verifier
    also scores every completed rollout: its rewards, filtered for want of a task input, are not compared)."""
    groups = {b["group_id"] for b in expected["Baseline"].values()}
    keep = {"Baseline": lambda r: True, "Reward": lambda r: r["reward_config_id"] in config_ids,
            "Credit": lambda r: r["group_id"] in groups, "Sample": lambda r: bool(set(r["group_ids"]) & groups)}
    out = Collected()
    for name in NAMES:
        for record in got.records.get(name, []):
            if keep[name](record):
                out.add(name, None, record)
    return out


def baseline_worker_kills(settings: Settings, workdir: Path, progress: Progress, *, sessions: int = 24,
                          seed: int = 0) -> FaultResult:
    """Fault (l) on a private pipeline of the shared broker."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "feedback.yaml").write_text(yaml.safe_dump(FEEDBACK))
    (workdir / "baseline.yaml").write_text(yaml.safe_dump(BASELINE))
    feedback_cfg = load_feedback_config(workdir / "feedback.yaml")
    cfg = load_config(BaselineConfig, workdir / "baseline.yaml")
    pipeline = Pipeline.create(settings, workdir / "pipeline", feedback_join=True,
                               feedback_config=workdir / "feedback.yaml", baselines=True,
                               baseline_config=workdir / "baseline.yaml")
    pipeline.crash_restarts_allowed = 3  # as in fault (b): a restarted worker may stop once to re-read offsets
    t0 = time.monotonic()
    try:
        proc = pipeline.settings.processors
        stages = StageConfigs.load(proc.reward_config, proc.credit_config, proc.sample_config)
        inputs = workload(sessions, seed)
        expected = clean_run(inputs, feedback_cfg, cfg, stages)
        windows = len(expected["Baseline"])
        pipeline.produce(inputs.events)
        for item in inputs.feedback:
            pipeline.produce_raw(pipeline.topics.feedback, item["target_id"].encode(), pipeline.codec.encode(
                "Feedback", item))
        pipeline.flush()
        config_ids = {feedback_cfg.id, cfg.id}

        def feedback_rewards(c: Collected) -> int:
            return sum(r["reward_config_id"] == feedback_cfg.id for r in c.records["Reward"])

        # Kill 1: feedback rewards are coming out; the baselines hold members, no window has closed (lag 20 s).
        worker = pipeline.start_worker()
        pipeline.collect(lambda c: feedback_rewards(c) > 0, timeout_s=90)
        pipeline.kill(worker)
        at_kill_1 = (feedback_rewards(pipeline.collected), len(pipeline.collected.records.get("Baseline", [])))
        wanted = sum(r["reward_config_id"] == feedback_cfg.id for r in expected["Reward"].values())
        progress(f"fault l: {time.monotonic() - t0:.0f}s: worker killed -9 with {at_kill_1[0]} of {wanted} feedback "
                 f"rewards and {at_kill_1[1]} of {windows} baseline windows out")
        # Kill 2: the first windows have closed, the rest have not.
        worker = pipeline.start_worker()
        pipeline.collect(lambda c: len(c.records.get("Baseline", [])) > 0, timeout_s=120)
        pipeline.kill(worker)
        at_kill_2 = len({b["event_id"] for b in pipeline.collected.records.get("Baseline", [])})
        progress(f"fault l: {time.monotonic() - t0:.0f}s: worker killed -9 again with {at_kill_2} of {windows} "
                 "baseline windows out")
        pipeline.start_worker()
        pipeline.collect(lambda c: all(set(expected[n]) <= baseline_records(c, expected, config_ids).ids(n)
                                       for n in NAMES), timeout_s=150)
        got = baseline_records(pipeline.settle(quiet_s=3.0), expected, config_ids)
        cmp = compare(got, expected, NAMES)
        unmeasured = [d for d in pipeline.collected.records["DeadLetter"] if d["stage"] in UNMEASURED_STAGES]
        passed = cmp.lost == cmp.duplicated == 0 and not unmeasured and at_kill_2 < windows
        detail = cmp.detail
        if at_kill_2 >= windows:
            detail += "; every window was out before the second kill (not mid-stream)"
        if unmeasured:
            detail += f"; {len(unmeasured)} input(s) not measured, first: {unmeasured[0]['stage']} " \
                      f"{unmeasured[0]['reason']!r}"
        if pipeline.crash_causes:
            causes = "\n".join(pipeline.crash_causes)
            detail += f"; {len(pipeline.crash_causes)} crashed worker(s) restarted:\n{causes}"
        if not passed:
            detail += f"\nworker log (last lines):\n{pipeline.log_tail(60)}"
        counts = {n: len(expected[n]) for n in NAMES}
        progress(f"fault l: {time.monotonic() - t0:.0f}s: lost {cmp.lost}, duplicated {cmp.duplicated} "
                 f"({cmp.redelivered} identical redeliveries)")
        return FaultResult(
            "l. baseline agents kill -9", f"2 kills (feedback rewards out, baselines holding; {at_kill_2} of "
            f"{windows} windows out) over {sessions} organic sessions ({counts})", cmp.lost, cmp.duplicated,
            passed, detail, cmp.redelivered, time.monotonic() - t0)
    finally:
        pipeline.close()

