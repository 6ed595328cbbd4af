"""Baselines without siblings in a real worker on the real broker: organic-session rollouts, rewards from
feedback alone (thumbs on the session), grouped by the cluster of their first user message. A window with
enough rollouts of a cluster forms a group; a later, smaller one is measured against the cluster's running
baseline (recorded as a Baseline event) with a non-zero advantage; a cluster with no history gets none.
Every Baseline, Reward, Credit and Sample equals what the pure core derives from the same rollouts and
rewards (the replay's computation); samples reach the samples topic naming their baseline window. Garbage on
the rewards topic and on the internal by-key topic is dead-lettered, and the good input after it flows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from processors.baselines.config import BaselineConfig
from processors.baselines.derive import derive_window
from processors.baselines.keys import rollout_key
from processors.baselines.members import first_call_key, is_baseline_input, member_of, reward_of_attempt
from processors.baselines.windows import batch_windows
from processors.config import load_config
from processors.feedback.config import load_feedback_config
from schemas.tokens import unpack_floats
from tests.processors.baselines.organic import T0_US, S, organic_rollout, thumbs

from .stream_rig import Collected, StreamRig

FEEDBACK = {"name": "baseline-stream-test", "wait_s": {k: 1 for k in ("BINARY", "RATING", "OUTCOME",
                                                                      "TASK_OUTCOME", "TEXT")},
            "watermark_lag_s": 1, "match_wait_s": 60, "closed_retention_s": 120, "combine": "latest"}
BASELINE = {"name": "baseline-stream-test", "window": {"kind": "tumbling", "size_s": 10}, "min_group_size": 3,
            "watermark_lag_s": 1, "running": {"method": "ewma", "alpha": 0.1}}
FIX = "Fix the failing test in {} line {}"
# cluster A: three rollouts in window [0 s, 10 s) (a group), one later (too small: running baseline);
# cluster B: one rollout, no history (no advantage). (name, message, seconds after T0, thumbs up)
PHASE_1 = [("a1", FIX.format("foo.py", 42), 7.0, True), ("a2", FIX.format("src/bar.py", 7), 7.2, False),
           ("a3", FIX.format("baz.py", 310), 7.4, True), ("b1", "Write a haiku about autumn", 7.6, True)]
# Far ahead in event time: stream time is the newest event time plus the wall time since, so however long the
# machine takes between the phases, a4's window has not closed before it arrives.
PHASE_2 = [("a4", FIX.format("qux.py", 9), 1007.0, False)]


def produce(rig: StreamRig, rollouts: list[tuple[str, str, float, bool]], seed: int) -> list:
    events = []
    for k, (name, message, at_s, _) in enumerate(rollouts):
        events += organic_rollout(name, message, T0_US + round(at_s * S), seed + k)
    rig.produce(events)
    for name, _, at_s, up in rollouts:
        item = thumbs(name, up, T0_US + round((at_s + 0.5) * S))
        rig.produce_raw(rig.topics.feedback, item["target_id"].encode(), rig.codec.encode("Feedback", item))
    rig.flush()
    return events


def expected_events(rig: StreamRig, events: list, got: Collected, cfg: BaselineConfig, credit, sample) -> dict:
    """What the pure core derives from the same rollouts and the feedback rewards the stream emitted."""
    rollouts = rig.expected(events)["CompletedRollout"]
    first_keys = {(c["rollout_id"], c["attempt_id"]): first_call_key(c, cfg) for name, c in events
                  if name == "CallRecord" and c["call_index"] == 0}
    rewards = [r for r in got.unique("Reward").values() if is_baseline_input(r, cfg)]
    members: dict[str, list] = {}
    inputs = {}
    for rollout in rollouts.values():
        reward = next(r for r in rewards if reward_of_attempt(r, rollout["event_id"]))
        key = rollout_key(rollout, cfg.key, first_keys[(rollout["rollout_id"], rollout["attempt_id"])])
        members.setdefault(key, []).append(member_of(rollout, reward))
        inputs[reward["event_id"]] = reward
    by_event = {r["event_id"]: r for r in rollouts.values()}
    out: dict[str, dict] = {}
    for window in batch_windows(members, cfg):
        for name, record in derive_window(window, by_event, inputs, credit, sample):
            out.setdefault(name, {})[record["event_id"]] = record
    return out


def test_organic_rollouts_get_group_and_running_baselines(make_stream_rig: Callable[..., StreamRig],
                                                          tmp_path: Path) -> None:
    (tmp_path / "feedback.yaml").write_text(yaml.safe_dump(FEEDBACK))
    (tmp_path / "baseline.yaml").write_text(yaml.safe_dump(BASELINE))
    cfg = load_config(BaselineConfig, tmp_path / "baseline.yaml")
    feedback_cfg = load_feedback_config(tmp_path / "feedback.yaml")
    rig = make_stream_rig(feedback_join=True, feedback_config=tmp_path / "feedback.yaml", baselines=True,
                          baseline_config=tmp_path / "baseline.yaml")
    stages = rig.stages
    events = produce(rig, PHASE_1, seed=11)
    rig.produce_raw(rig.topics.rewards, b"session-a1", b"\x00not a reward")  # bad input first
    rig.produce_raw(rig.topics.baseline_by_key, b"cluster:x", b"\x00\x00\x00\x09not a member")
    rig.flush()
    rig.start_worker()

    def windows(got: Collected) -> dict[str, dict]:
        return {b["event_id"]: b for b in got.records.get("Baseline", [])}

    got = rig.collect(lambda g: len(windows(g)) >= 2 and len({d["stage"] for d in g.records["DeadLetter"]}
                                                            & {"baseline", "baseline_rewards"}) == 2, timeout_s=120)
    assert {d["stage"] for d in got.records["DeadLetter"]} >= {"baseline", "baseline_rewards"}
    events += produce(rig, PHASE_2, seed=21)  # after the bad input: still measured
    got = rig.collect(lambda g: len(windows(g)) >= 3 and any(
        s["group_ids"] == [b["group_id"]] for b in windows(g).values() if b["method"] == "RUNNING"
        and b["count_before"] > 0 for s in g.unique("Sample").values()), timeout_s=120)
    got = rig.settle()

    feedback_rewards = [r for r in got.unique("Reward").values() if r["reward_config_id"] == feedback_cfg.id]
    assert len(feedback_rewards) == 5 and all(not r["filtered"] for r in feedback_rewards)
    by_method = sorted((b["method"], len(b["rollout_ids"]), b["count_before"]) for b in windows(got).values())
    assert by_method == [("GROUP", 3, 0), ("RUNNING", 1, 0), ("RUNNING", 1, 3)], [
        (b["key"], b["rollout_ids"], b["window_start_us"] - T0_US, b["created_at_us"]) for b in windows(got).values()]
    group = next(b for b in windows(got).values() if b["method"] == "GROUP")
    running = next(b for b in windows(got).values() if b["method"] == "RUNNING" and b["count_before"] == 3)
    lonely = next(b for b in windows(got).values() if b["method"] == "RUNNING" and b["count_before"] == 0)
    assert group["key"] == running["key"] != lonely["key"]  # a1..a4 share a cluster, b1 has its own
    assert sorted(group["rollout_ids"]) == ["session-a1", "session-a2", "session-a3"]
    assert group["rollout_advantages"] == [0.5, -1.0, 0.5]  # leave-one-out over thumbs 1, 0, 1
    # The running baseline: ewma (alpha 0.1) of 1, 0, 1 = 0.91; a4's thumbs-down measured against it.
    assert running["previous_id"] == group["event_id"] and running["rollout_ids"] == ["session-a4"]
    assert np.isclose(running["running_before"], 0.91) and np.isclose(running["rollout_advantages"][0], -0.91)
    assert lonely["rollout_advantages"] == [None]  # no history, no prior: no advantage
    # Every derived event is what the pure core derives from the same inputs (so replay re-derives it).
    want = expected_events(rig, events, got, cfg, stages.credit, stages.sample)
    assert windows(got) == want["Baseline"]
    for name in ("Reward", "Credit", "Sample"):
        mine = {k: v for k, v in got.unique(name).items() if v["group_id" if name != "Sample" else "group_ids"]
                in ([b["group_id"] for b in want["Baseline"].values()] if name != "Sample"
                    else [[b["group_id"]] for b in want["Baseline"].values()])}
        assert mine == want[name], name
    samples = [s for s in got.unique("Sample").values() if s["group_ids"] == [running["group_id"]]]
    assert samples and all(np.isclose(unpack_floats(s["advantages"])[unpack_floats(s["weights"]) > 0], -0.91).all()
                           for s in samples)
    lonely_rewards = [r for r in want["Reward"].values() if r["group_id"] == lonely["group_id"]]
    assert [r["filter_reason"].split(":")[0] for r in lonely_rewards] == ["no_baseline_yet"]
