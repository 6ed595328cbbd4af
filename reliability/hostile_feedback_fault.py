"""Fault (m): hostile feedback against a running worker (issue 29; what is sent: hostile_feedback.py).

A group of rollouts goes through a worker with the feedback join on, its feedback sent ahead of it: one
oversized feedback (6 MiB of ``details``, whose join entry would pass Kafka's 16 MiB limit), a flood of
16k-character texts on one rollout and of ratings on another and on a rollout's session, a century-ahead
event time (honestly made) and a forged creation time, between good feedback. Passed: the worker never
crashed, every rollout has its one feedback reward (the first one's from the good feedback sent last), every
feedback sent is admitted or dead-lettered with its reason (lost: neither), and the rollouts still became
samples. Duplicated: a reward emitted twice."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import yaml

from processors.feedback.config import load_feedback_config
from reliability.hostile_feedback import JOIN_CONFIG, MAX_ITEMS, feedback_outcomes, hostile_feedback
from reliability.pipeline import Pipeline, core_outputs, group_events, interleave
from reliability.results import FaultResult
from tokentrail.settings import Settings

NAME = "m. hostile feedback: oversized, floods, future-dated"
OVERSIZED_BYTES = 6 * 1024 * 1024
FLOODS = 100  # 16k-character texts pass the 4 MiB key budget at about 80
SESSION = "sess-hm-r1"


def hostile_feedback_fault(settings: Settings, workdir: Path, progress: Callable[[str], None]) -> FaultResult:
    began = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "feedback_reward.yaml"
    config_path.write_text(yaml.safe_dump(JOIN_CONFIG))
    cfg = load_feedback_config(config_path)
    pipeline = Pipeline.create(settings, workdir, feedback_join=True, feedback_config=config_path,
                               max_key_state_items=MAX_ITEMS)
    try:
        events = group_events("hm", seed=4)
        for name, record in events:  # the second rollout's calls belong to a session, which gets a flood too
            if name == "CallRecord" and record["rollout_id"] == "hm-r1":
                record["session_id"] = SESSION
        events = interleave(events, seed=2)
        # The rollouts as the worker will complete them (the pure core): the feedback, dated by their close,
        # is sent before their events, so it waits in the join when each rollout arrives (the order in which
        # a flood once kept its rollout out); the outcome is the same in either order, and no window can
        # close on a slow machine before the feedback that must reach it is in.
        rollouts = sorted(core_outputs(events, pipeline.settings)["CompletedRollout"].values(),
                          key=lambda r: r["rollout_id"])
        close = max(r["created_at_us"] for r in rollouts)
        plan = hostile_feedback([r["rollout_id"] for r in rollouts], close, round(time.time() * 1e6),
                                oversized_bytes=OVERSIZED_BYTES, floods=FLOODS, session=SESSION)
        progress(f"fault m: {len(plan.sent)} feedback ({sum(len(str(f)) for f in plan.sent) / 2**20:.1f} MiB)")
        for item in plan.sent:
            pipeline.produce_raw(pipeline.topics.feedback, item["target_id"].encode(),
                                 pipeline.codec.encode("Feedback", item))
        pipeline.flush()
        pipeline.produce(events)
        pipeline.start_worker()

        def rewards() -> list[dict]:
            return [r for r in pipeline.collected.records["Reward"] if r["reward_config_id"] == cfg.id]

        finished = pipeline.collect(lambda c: len({r["rollout_id"] for r in rewards()}) == 4
                                    and {rid for s in c.records["Sample"] for rid in s["rollout_ids"]}
                                    == {r["rollout_id"] for r in rollouts}, timeout_s=120)
        got = pipeline.settle(quiet_s=3.0)
        fates = feedback_outcomes(plan, rewards(), got.records["DeadLetter"])
        lost = sum(v["missing"] for v in fates.values())
        duplicated = sum(n - 1 for n in Counter(r["event_id"] for r in rewards()).values())
        by_rollout = {r["rollout_id"]: r for r in rewards()}
        first = rollouts[0]["rollout_id"]
        checks = {
            "finished": finished,
            "no worker crash": not any(p.poll() not in (None, 0) for p in pipeline.workers),
            "oversized dead-lettered": fates["oversized"] == Counter(StateOverflow=1),
            "floods bounded": all(fates[f]["StateOverflow"] >= 1 for f in ("text flood", "rating flood",
                                                                          "session flood")),
            "forged time refused": fates["future, forged"] == Counter(InvalidEvent=1),
            "good feedback used": by_rollout.get(first, {}).get("score_ids") == [plan.must_use[first]],
        }
        failed = [name for name, ok in checks.items() if not ok]
        tried = ", ".join(f"{what}: {dict(v)}" for what, v in fates.items())
        return FaultResult(NAME, f"{len(plan.sent)} feedback on 4 rollouts ({tried})", lost, duplicated,
                           not failed and lost == 0 and duplicated == 0,
                           f"failed: {failed}\n{pipeline.log_tail()}" if failed else "",
                           seconds=time.monotonic() - began)
    finally:
        pipeline.close()
