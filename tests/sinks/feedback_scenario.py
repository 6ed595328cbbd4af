"""Stored feedback as the stream leaves it, for the audit, replay and report tests on chDB: a synthetic
group's rollouts, feedback naming them (and nothing), and the rewards, late and unmatched records the
pure join (processors/feedback/join.py) emits when one feedback arrives after its rollout's window closed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from processors.dead_letters import dead_letter
from processors.feedback.config import FeedbackRewardConfig
from processors.feedback.join import (
    FeedbackJoin,
    FeedbackReward,
    LateFeedback,
    Output,
    UnmatchedFeedback,
    late_dead_letter,
    reward_record,
    rollout_ref,
    unmatched_dead_letter,
)
from schemas.codec import get_codec
from schemas.feedback import FeedbackValue, build_feedback
from testkit.storage_records import Event, GroupSpec, synthetic_group

S = 1_000_000
CFG = FeedbackRewardConfig(name="audit-test", wait_s=dict.fromkeys(("BINARY", "RATING", "OUTCOME", "TASK_OUTCOME",
                                                                    "TEXT"), 60.0),
                           watermark_lag_s=5, match_wait_s=100, closed_retention_s=1000, combine="latest")
Record = dict[str, Any]


@dataclass
class FeedbackScenario:
    events: list[Event] = field(default_factory=list)  # group, feedback, rewards, dead letters
    feedback: dict[str, Record] = field(default_factory=dict)  # name -> feedback
    rewards: dict[str, Record] = field(default_factory=dict)  # rollout id -> the stream's feedback reward
    letters: dict[str, Record] = field(default_factory=dict)  # feedback name -> its dead letter
    rollout_ids: list[str] = field(default_factory=list)

    def without(self, record: Record) -> list[Event]:
        return [(n, r) for n, r in self.events if r is not record]


def feedback_scenario() -> FeedbackScenario:
    group = synthetic_group(GroupSpec(group_index=0, policy_version=1))
    rollouts = group.of("CompletedRollout")
    refs = [rollout_ref(r) for r in rollouts]
    close = max(ref.closed_at_us for ref in refs)
    r0, r1 = refs[0], refs[1]

    def make(target_kind: str, target_id: str, kind: str, at_s: float, value: FeedbackValue) -> Record:
        return build_feedback(source="ui", target_kind=target_kind, target_id=target_id, kind=kind, value=value,
                              event_time_us=close + round(at_s * S), created_at_us=close + round(at_s * S) + 1)

    out = FeedbackScenario(events=list(group.events), rollout_ids=[ref.rollout_id for ref in refs])
    out.feedback = {
        "thumb": make("ROLLOUT", r0.rollout_id, "BINARY", 10, FeedbackValue(binary=True)),
        "rating": make("CALL", r1.call_ids[0], "RATING", 20, FeedbackValue(rating=0.8)),
        "late": make("ROLLOUT", r1.rollout_id, "OUTCOME", 30, FeedbackValue(outcome="REJECTED")),
        "ghost": make("ROLLOUT", "no-such-rollout", "BINARY", -200, FeedbackValue(binary=False)),
    }
    fb = out.feedback
    join = FeedbackJoin(CFG)
    outputs: list[Output] = [o for ref in refs for o in join.add_rollout(ref)]
    for name in ("thumb", "rating", "ghost"):
        outputs += join.add_feedback(fb[name])
    outputs += join.tick(close + 200 * S)  # every window closes, the ghost stops waiting
    outputs += join.add_feedback(fb["late"])  # after r1's window closed: late (after_close)
    codec = get_codec()
    by_id = {f["event_id"]: name for name, f in fb.items()}
    offsets = {name: i for i, name in enumerate(fb)}
    # Invalid feedback (a rating outside its scale) the router refused: stored by the sink all the same.
    fb["invalid"] = dict(make("ROLLOUT", r0.rollout_id, "RATING", 15, FeedbackValue(rating=0.5)), rating=7.0)
    out.events += [("Feedback", f) for f in fb.values()]
    out.letters["invalid"] = dead_letter(stage="feedback_router", source_topic="tokentrail.feedback", partition=0,
                                         offset=9, key=r0.rollout_id.encode(), value=codec.encode("Feedback",
                                                                                                  fb["invalid"]),
                                         error="rating 7.0 is outside its scale", error_type="InvalidEvent",
                                         created_at_us=fb["invalid"]["created_at_us"])
    out.events.append(("DeadLetter", out.letters["invalid"]))
    for item in outputs:
        if isinstance(item, FeedbackReward):
            record = reward_record(item)
            out.rewards[item.rollout_id] = record
            out.events.append(("Reward", record))
            continue
        assert isinstance(item, LateFeedback | UnmatchedFeedback)
        name = by_id[item.feedback_id]
        place = {"source_topic": "tokentrail.feedback", "partition": 0, "offset": offsets[name],
                 "key": fb[name]["target_id"].encode(), "value": codec.encode("Feedback", fb[name]),
                 "created_at_us": fb[name]["created_at_us"]}
        letter = (late_dead_letter(item, rollout_id=r1.rollout_id, **place) if isinstance(item, LateFeedback)
                  else unmatched_dead_letter(item, **place))
        out.letters[name] = letter
        out.events.append(("DeadLetter", letter))
    assert set(out.letters) == {"late", "ghost", "invalid"} and len(out.rewards) == len(refs)
    return out
