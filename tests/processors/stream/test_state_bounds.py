"""The bounds of issue 29 in the parts, cheaply: the stream clock's future skew (also when seeded from a
poisoned entry header after a restart), a feedback's time capped at its creation, a table's budget."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from processors.feedback.config import FeedbackRewardConfig
from processors.feedback.join import FeedbackJoin, FeedbackReward, RolloutRef
from processors.stream.clock import MAX_FUTURE_SKEW_S, PartitionClocks
from processors.stream.entries import pack_entry
from processors.stream.state_budget import StateBudget, StateOverflow, admit, bind
from processors.stream.tables import scan
from schemas.feedback import FeedbackValue, build_feedback

S = 1_000_000
CENTURY_US = 100 * 365 * 86_400 * S


def test_no_event_moves_the_clock_past_the_skew_and_a_poisoned_header_does_not_survive() -> None:
    now = round(time.time() * S)
    clocks = PartitionClocks()
    clocks.observe(0, now - 3600 * S)  # the past (a replay) is taken as is
    assert abs(clocks.now_us(0) - (now - 3600 * S)) < 5 * S  # type: ignore[operator]
    clocks.observe(0, now + CENTURY_US)
    assert clocks.now_us(0) <= now + (MAX_FUTURE_SKEW_S + 5) * S  # type: ignore[operator]

    # a restarted worker seeds its clock from the newest time in its entries' headers
    table = SimpleNamespace(data={b"k": pack_entry(1, None, now + CENTURY_US, b"{}")})
    restarted = PartitionClocks()
    scan(table, {1}, restarted)
    assert restarted.now_us(1) <= now + (MAX_FUTURE_SKEW_S + 5) * S  # type: ignore[operator]


def _feedback(at_us: int, made_us: int, rating: float, n: str) -> dict:
    return build_feedback(source="t", target_kind="ROLLOUT", target_id="r1", kind="RATING",
                          value=FeedbackValue(rating=rating), event_time_us=at_us, created_at_us=made_us,
                          source_feedback_id=n)


def test_a_feedback_counts_at_most_when_it_was_made() -> None:
    """A poster dating its feedback ahead (the gateway allows +300 s) neither wins ``latest`` nor closes the
    window early: the honest feedback made after it is the one used."""
    join = FeedbackJoin(FeedbackRewardConfig())
    join.add_rollout(RolloutRef("ev", "r1", "a1", 0))
    out = join.add_feedback(_feedback(300 * S, 1, 1.0, "poster"))
    out += join.add_feedback(_feedback(CENTURY_US, 2, 1.0, "far"))  # honest creation, absurd event time
    honest = _feedback(10 * S, 10 * S, 0.0, "honest")
    out += join.add_feedback(honest)
    assert not out  # nothing closed, nothing late
    out = join.tick(2 * 3600 * S)
    rewards = [o for o in out if isinstance(o, FeedbackReward)]
    assert len(rewards) == 1 and rewards[0].used_ids == (honest["event_id"],) and rewards[0].reward == 0.0


def test_a_table_budget_refuses_by_bytes_and_by_items() -> None:
    class Table:
        name = "feedback-join"

    table = Table()
    bind(table, StateBudget(max_bytes=100, max_items=3))
    admit(table, b"k", b"x" * 90, items=3)
    with pytest.raises(StateOverflow, match="over its budget of 100"):
        admit(table, b"k", b"x" * 100, items=1)  # the key counts too
    with pytest.raises(StateOverflow, match="hold 4 items"):
        admit(table, b"k", b"x", items=4)
