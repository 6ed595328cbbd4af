"""Baselines in replay (sinks/replay.py: replay_baselines) from what ClickHouse (chDB) stores: organic-session
calls and rollouts, and the feedback rewards the pure feedback join made from thumbs on the sessions. Replay
pairs each attempt with its reward and its first call's cluster, and derives the windows and events the pure
core derives from the same inputs (so the stream's events are re-derived with the same ids); a replayed
feedback reward and a filtered one are not read. The Baseline events round-trip through the baselines table."""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from processors.baselines.config import BaselineConfig
from processors.baselines.derive import derive_window
from processors.baselines.keys import rollout_key
from processors.baselines.members import first_call_key, member_of, reward_of_attempt
from processors.baselines.windows import batch_windows
from processors.feedback.config import FeedbackRewardConfig
from processors.feedback.join import FeedbackJoin, FeedbackReward, reward_record, rollout_ref
from processors.feedback.replay import replay_reward_record
from processors.grouper import GroupingConfig
from processors.pipeline import StageConfigs
from reliability.pipeline import derive_outputs
from schemas.local_paths import DEPLOY_CONFIG_DIR
from sinks.audit import check_score_reviewability
from sinks.replay import replay_baselines
from sinks.store import load_records, write_records
from tests.processors.baselines.organic import T0_US, S, organic_rollout, thumbs

CFG = BaselineConfig(window={"size_s": 10}, min_group_size=3, watermark_lag_s=1)
FEEDBACK = FeedbackRewardConfig(wait_s={k: 1 for k in ("BINARY", "RATING", "OUTCOME", "TASK_OUTCOME", "TEXT")},
                                watermark_lag_s=1)
ROLLOUTS = [("a1", "Fix the failing test in foo.py line 42", 7.0, True),
            ("a2", "Fix the failing test in src/bar.py line 7", 7.2, False),
            ("a3", "fix the failing test in baz.py line 310", 7.4, True),
            ("b1", "Write a haiku about autumn", 7.6, True),
            ("a4", "Fix the failing test in qux.py line 9", 17.0, False),
            ("c1", "Summarise this thread", 8.0, None)]  # no feedback: a filtered feedback reward


def test_replay_derives_the_baselines_from_stored_rollouts_and_feedback_rewards(ch: Client) -> None:
    stages = StageConfigs.load(DEPLOY_CONFIG_DIR / "reward.yaml", DEPLOY_CONFIG_DIR / "credit.yaml",
                               DEPLOY_CONFIG_DIR / "sample.yaml")
    events = [e for k, (name, message, at_s, _) in enumerate(ROLLOUTS)
              for e in organic_rollout(name, message, T0_US + round(at_s * S), seed=k)]
    derived = derive_outputs(events, GroupingConfig(), stages, ["processors.verifiers.answer_match:AnswerMatch"])
    rollouts = list(derived["CompletedRollout"].values())
    join = FeedbackJoin(FEEDBACK)
    inputs_in_time = [(r["created_at_us"], "rollout", r) for r in rollouts] + [
        (T0_US + round((at_s + 0.5) * S), "feedback", thumbs(name, up, T0_US + round((at_s + 0.5) * S)))
        for name, _, at_s, up in ROLLOUTS if up is not None]
    outputs = []
    for _, kind, item in sorted(inputs_in_time, key=lambda x: (x[0], x[1])):
        outputs += (join.add_rollout(rollout_ref(item, [item["rollout_id"].replace("session-", "sess-")]))
                    if kind == "rollout" else join.add_feedback(item))
    outputs += join.tick(T0_US + 100 * S)
    feedback_rewards = [o for o in outputs if isinstance(o, FeedbackReward)]
    rewards = [reward_record(o) for o in feedback_rewards]
    assert len(rewards) == 6 and sum(r["filtered"] for r in rewards) == 1
    stored = [*(("CallRecord", r) for n, r in events if n == "CallRecord"),
              *(("CompletedRollout", r) for r in rollouts), *(("Reward", r) for r in rewards),
              ("Reward", replay_reward_record(feedback_rewards[0]))]
    write_records(ch, stored)

    result = replay_baselines(ch, CFG, stages)

    # What the pure core derives from the same records in memory.
    first = {(c["rollout_id"], c["attempt_id"]): first_call_key(c, CFG) for n, c in events
             if n == "CallRecord" and c["call_index"] == 0}
    members, inputs = {}, {}
    for rollout in rollouts:
        reward = next(r for r in rewards if reward_of_attempt(r, rollout["event_id"]))
        if not reward["filtered"]:
            key = rollout_key(rollout, CFG.key, first[(rollout["rollout_id"], rollout["attempt_id"])])
            members.setdefault(key, []).append(member_of(rollout, reward))
            inputs[reward["event_id"]] = reward
    windows = batch_windows(members, CFG)
    want = [e for w in windows for e in derive_window(w, {r["event_id"]: r for r in rollouts}, inputs,
                                                       stages.credit, stages.sample)]
    assert result.members == 5 and result.unpaired == 0
    assert result.events == want
    assert sorted((w.method, len(w.members), w.before.count) for w in windows) == [
        ("GROUP", 3, 0), ("RUNNING", 1, 0), ("RUNNING", 1, 3)]
    assert result.counts()["Baseline"] == 3 and result.counts()["Sample"] > 0

    baselines = [rec for name, rec in result.events if name == "Baseline"]
    write_records(ch, [("Baseline", rec) for rec in baselines])
    assert load_records(ch, "baselines", order_by="event_id") == sorted(baselines, key=lambda b: b["event_id"])
    assert replay_baselines(ch, CFG, stages).events == want  # stored Baseline events change nothing

    # The audit's check (c): a reward measured against a baseline names a stored Baseline event.
    write_records(ch, [(name, rec) for name, rec in result.events if name != "Baseline"])
    assert check_score_reviewability(ch).passed
    measured = next(rec for name, rec in result.events if name == "Reward")
    orphan = dict(measured, event_id="orphan-reward",
                  components_json=measured["components_json"].replace(baselines[0]["event_id"], "no-such-baseline"))
    write_records(ch, [("Reward", orphan)])
    check = check_score_reviewability(ch)
    assert check.failing_ids() == ["orphan-reward"] and "no-such-baseline" in check.failures[0].reason
