"""Hostile feedback in a real worker on the real broker (issue 29, High 2 and Medium 4): an oversized feedback,
a text flood and a rating flood on one rollout each, a rating flood on a rollout's session, and two feedback
dated a century ahead, between good feedback, all sent before the rollouts' events (the order in which a flood
once kept its own rollout out of the join's state, and a session's index out of the resolver's). Kafka's record
limit is lowered to 1 MiB for this pipeline so that what took a 34 MiB changelog entry at the default 16 MiB
fits a short test. Before the fix the join's changelog write failed and the worker crash-looped, and the
future-dated time closed the first rollout's window so its later honest feedback was late. Now: the worker keeps
running, each rollout gets its one feedback reward (the first one's from the honest feedback sent last), every
feedback sent is admitted or dead-lettered with its reason, and the rollouts still become samples."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import yaml

from processors.feedback.config import load_feedback_config
from reliability.hostile_feedback import (
    JOIN_CONFIG,
    MAX_ITEMS,
    feedback_outcomes,
    hostile_feedback,
)

from .stream_rig import StreamRig, group_events, interleave

KAFKA_LIMIT = 1 << 20
FLOODS = 30
SESSION = "sess-hf-r1"


def test_hostile_feedback_is_bounded_dead_lettered_and_good_feedback_still_joins(
        make_stream_rig: Callable[..., StreamRig], tmp_path: Path) -> None:
    config_path = tmp_path / "feedback_reward.yaml"
    config_path.write_text(yaml.safe_dump(JOIN_CONFIG))
    cfg = load_feedback_config(config_path)
    rig = make_stream_rig(kafka_overrides={"max_message_bytes": KAFKA_LIMIT}, feedback_join=True,
                          feedback_config=config_path, max_key_state_items=MAX_ITEMS)
    events = group_events("hf", seed=4)
    for name, record in events:  # the second rollout's calls belong to a session, which gets a flood too
        if name == "CallRecord" and record["rollout_id"] == "hf-r1":
            record["session_id"] = SESSION
    events = interleave(events, seed=2)
    # The rollouts as the worker will complete them (the pure core, from the same events): the feedback is
    # dated by their close and sent BEFORE their events, so it waits in the join when each rollout arrives.
    # That is the order in which a flood once kept its rollout out (refused as over the budget: no reward);
    # the outcome is the same whichever arrives first, so the test does not depend on which agent is faster.
    rollouts = sorted(rig.expected(events)["CompletedRollout"].values(), key=lambda r: r["rollout_id"])
    close = max(r["created_at_us"] for r in rollouts)
    plan = hostile_feedback([r["rollout_id"] for r in rollouts], close, round(time.time() * 1e6),
                            oversized_bytes=KAFKA_LIMIT * 6 // 10, floods=FLOODS, session=SESSION)
    for item in plan.sent:
        rig.produce_raw(rig.topics.feedback, item["target_id"].encode(), rig.codec.encode("Feedback", item))
    rig.flush()
    rig.start_worker()
    # The events only once the resolver has taken the whole session flood (its overflow letters are out): the
    # session's index then meets a full entry, whichever agent of the worker is faster.
    flood = {fid for fid, what in plan.kinds.items() if what == "session flood"}

    def session_overflows(c: object) -> int:
        return sum(1 for d in rig.collected.records["DeadLetter"]
                   if d["error_type"] == "StateOverflow" and any(fid in d["reason"] for fid in flood))

    rig.collect(lambda c: session_overflows(c) >= FLOODS - MAX_ITEMS, timeout_s=120)
    rig.produce(events)

    def rewards(c: object) -> list[dict]:
        return [r for r in rig.collected.records["Reward"] if r["reward_config_id"] == cfg.id]

    got = rig.collect(lambda c: len({r["rollout_id"] for r in rewards(c)}) == 4
                      and len(c.ids("Sample")) > 0, timeout_s=180)
    got = rig.settle()
    fates = feedback_outcomes(plan, rewards(got), got.records["DeadLetter"])
    print("what became of each kind of feedback:", {k: dict(v) for k, v in fates.items()})
    assert all(v["missing"] == 0 for v in fates.values()), fates  # nothing sent is lost
    assert fates["oversized"] == Counter(StateOverflow=1)
    assert fates["good"] == Counter(admitted=2)
    assert fates["future, made now"] == Counter(admitted=1)  # counted when made, closing nothing early
    assert fates["future, forged"] == Counter(InvalidEvent=1)
    for flood in ("text flood", "rating flood", "session flood"):  # some admitted, the rest over the budget
        assert fates[flood]["admitted"] >= 1 and fates[flood]["StateOverflow"] >= 1, fates[flood]
        assert fates[flood]["admitted"] + fates[flood]["StateOverflow"] == FLOODS
    assert fates["rating flood"]["admitted"] == MAX_ITEMS - 1  # the budget counts the rollout itself too
    assert fates["session flood"]["admitted"] == MAX_ITEMS - 1  # and the session's, its rollout (resolver)
    by_rollout = {r["rollout_id"]: r for r in rewards(got)}
    assert len(rewards(got)) == 4  # one reward per rollout, none re-emitted by a restarted worker
    first, second, third, fourth = (r["rollout_id"] for r in rollouts)
    assert by_rollout[first]["score_ids"] == [plan.must_use[first]] and by_rollout[first]["reward"] == 0.7
    assert by_rollout[second]["reward"] == 0.3  # from its session's ratings; the oversized one was refused
    assert by_rollout[third]["filtered"]  # texts only: nothing with a value
    assert by_rollout[fourth]["reward"] == 0.5
    assert not [d for d in got.records["DeadLetter"] if d["stage"] == "feedback_late"]
    assert {rid for s in got.records["Sample"] for rid in s["rollout_ids"]} == {r["rollout_id"] for r in rollouts}
    assert rig.stop_all() == [0]  # the one worker ran throughout and stops cleanly
