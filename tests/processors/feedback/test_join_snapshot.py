"""The join's snapshot: a join restored from its snapshot (through JSON, as the stream's table stores it)
after any input emits what the uninterrupted join emits, so a restarted worker resumes where it was."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.feedback.config import FeedbackRewardConfig
from processors.feedback.join import FeedbackJoin, Output

from .scenarios import T0, Input, S, scenarios

PROPERTY = settings(derandomize=True, max_examples=200, deadline=None)
CFG = FeedbackRewardConfig(wait_s=dict.fromkeys(("BINARY", "RATING", "OUTCOME", "TASK_OUTCOME", "TEXT"), 5.0),
                           watermark_lag_s=2.0, match_wait_s=10.0, closed_retention_s=8.0, combine="mean")


def step(join: FeedbackJoin, item: Input) -> list[Output]:
    kind, value = item
    return join.add_rollout(value) if kind == "rollout" else join.add_feedback(value) if kind == "feedback" \
        else join.tick(value)


@PROPERTY
@given(scenario=scenarios(), order=st.randoms(use_true_random=False))
def test_a_join_restored_from_its_snapshot_after_every_input_emits_the_same(scenario: list[Input],
                                                                          order: object) -> None:
    arrivals = list(scenario)
    order.shuffle(arrivals)  # type: ignore[attr-defined]
    arrivals.append(("tick", T0 + 10_000 * S))
    straight, restored = FeedbackJoin(CFG), FeedbackJoin(CFG)
    for item in arrivals:
        expected = step(straight, item)
        assert step(restored, item) == expected
        restored = FeedbackJoin.restore(CFG, orjson.loads(orjson.dumps(restored.snapshot())))
        assert restored.next_due_us() == straight.next_due_us()
    assert straight.empty and restored.empty  # everything closed, expired and forgotten by the end


def test_next_due_is_when_a_tick_first_changes_something() -> None:
    from .scenarios import rollout
    join = FeedbackJoin(CFG)
    join.add_rollout(rollout(0, 0.0))
    due = join.next_due_us()
    assert due == T0 + 5 * S + 2 * S + 1
    assert join.tick(due - 1) == [] and len(join.tick(due)) == 1
