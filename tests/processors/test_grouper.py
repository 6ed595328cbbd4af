"""Grouper: explicit ids or configured keys (never position), FULL / PARTIAL / LATE, serializable state."""

from __future__ import annotations

import pytest

from processors.errors import InvalidEvent
from processors.grouper import GrouperState, GroupingConfig, GroupSlot, add_rollout, group_id_for

T0 = 1_700_000_000_000_000
S = 1_000_000


def rollout(rid: str, *, group_id: str | None = None, key: dict[str, str] | None = None, at: int = T0,
            expected: int | None = None, status: str = "COMPLETE", counted: bool = True,
            attempt: str = "a1", task: str = '{"q":1}') -> dict:
    return {"event_id": f"ev-{rid}-{attempt}", "rollout_id": rid, "attempt_id": attempt, "status": status,
            "counted": counted, "group_id": group_id, "group_key": key or {}, "expected_group_size": expected,
            "task_input_json": task, "created_at_us": at}


CFG = GroupingConfig(window_s=10, grace_s=2)


def test_explicit_group_closes_full_when_the_expected_size_arrives() -> None:
    state = GrouperState()
    assert state.add(rollout("r1", group_id="g", expected=3), CFG).emitted == []
    assert state.add(rollout("r2", group_id="g", expected=3, at=T0 + 5), CFG).emitted == []
    (emitted,) = state.add(rollout("r3", group_id="g", expected=3, at=T0 + 9), CFG).emitted
    group = emitted.group
    assert group["status"] == "FULL" and group["group_id"] == "g" and group["expected_size"] == 3
    assert group["rollout_ids"] == ["r1", "r2", "r3"]
    assert group["rollout_event_ids"] == ["ev-r1-a1", "ev-r2-a1", "ev-r3-a1"]
    assert group["created_at_us"] == T0 + 9


def test_groups_by_configured_key_regardless_of_arrival_position() -> None:
    cfg = GroupingConfig(key_fields=["task"], default_expected_size=2)
    state = GrouperState()
    arrivals = [rollout("a1", key={"task": "t1", "seed": "1"}), rollout("b1", key={"task": "t2"}),
                rollout("b2", key={"task": "t2", "seed": "9"}), rollout("a2", key={"task": "t1"})]
    groups = [e.group for r in arrivals for e in state.add(r, cfg).emitted]
    assert [(g["rollout_ids"], g["group_key_json"]) for g in groups] == [
        (["b1", "b2"], '{"task":"t2"}'), (["a1", "a2"], '{"task":"t1"}')]
    assert groups[0]["group_id"] == group_id_for(arrivals[1], cfg) != groups[1]["group_id"]
    # with all key fields, the seed splits them
    assert group_id_for(arrivals[0], GroupingConfig()) != group_id_for(arrivals[3], GroupingConfig())


def test_fallbacks_without_group_id_or_key() -> None:
    a, b = rollout("r1", task='{"q":1}'), rollout("r2", task='{"q":1}')
    assert group_id_for(a, CFG) == group_id_for(b, CFG)
    single = GroupingConfig(fallback="rollout")
    assert group_id_for(a, single) != group_id_for(b, single)
    with pytest.raises(ValueError):
        GroupingConfig(fallback="position")


def test_window_timeout_closes_partial_and_stragglers_are_late() -> None:
    state = GrouperState()
    state.add(rollout("r1", group_id="g", expected=4), CFG)
    state.add(rollout("r2", group_id="g", expected=4, at=T0 + 3 * S), CFG)
    # created after the window (10 s) but before the close (12 s): late, not a member
    (late_early,) = state.add(rollout("r3", group_id="g", expected=4, at=T0 + 11 * S), CFG).emitted
    assert late_early.group["status"] == "LATE" and late_early.group["rollout_ids"] == ["r3"]
    assert state.next_deadline_us(CFG) == T0 + 12 * S
    assert state.close_due(T0 + 12 * S - 1, CFG) == []
    (partial,) = state.close_due(T0 + 12 * S, CFG)
    assert partial.group["status"] == "PARTIAL" and partial.group["rollout_ids"] == ["r1", "r2"]
    assert partial.group["created_at_us"] == T0 + 12 * S  # the deadline, not the clock
    (late,) = state.add(rollout("r4", group_id="g", expected=4, at=T0 + 5 * S), CFG).emitted
    assert late.group["status"] == "LATE" and late.group["event_id"] != late_early.group["event_id"]
    # closed groups are forgotten after the retention; a new rollout then opens a fresh group
    cfg = GroupingConfig(window_s=10, grace_s=2, closed_retention_s=60)
    assert state.close_due(T0 + 100 * S, cfg) == [] and state.slots == {}


def test_incomplete_uncounted_and_duplicate_rollouts_are_not_grouped() -> None:
    state = GrouperState()
    assert "incomplete" in state.add(rollout("r1", group_id="g", status="INCOMPLETE"), CFG).ignored
    assert "does not count" in state.add(rollout("r1", group_id="g", counted=False), CFG).ignored
    assert state.slots == {}
    assert state.add(rollout("r1", group_id="g", expected=3), CFG).ignored is None
    assert state.add(rollout("r1", group_id="g", expected=3), CFG).ignored == "duplicate rollout event"
    assert "already has a counted attempt" in state.add(
        rollout("r1", group_id="g", expected=3, attempt="a2"), CFG).ignored


def test_slot_state_round_trips_with_payloads() -> None:
    slot, _ = add_rollout(None, rollout("r1", group_id="g", expected=3), CFG, payload=b"\x00rollout-1")
    slot, _ = add_rollout(GroupSlot.from_bytes(slot.to_bytes()), rollout("r2", group_id="g", expected=3), CFG)
    assert slot is not None
    slot = GroupSlot.from_bytes(slot.to_bytes())
    slot, added = add_rollout(slot, rollout("r3", group_id="g", expected=3), CFG, payload=b"three")
    (emitted,) = added.emitted
    assert emitted.payloads == [b"\x00rollout-1", None, b"three"]
    assert slot is not None and not slot.is_open and slot.members == []
    with pytest.raises(InvalidEvent):
        add_rollout(slot, rollout("x", group_id="other"), CFG)


def test_grouper_state_round_trip_gives_identical_results() -> None:
    arrivals = [rollout(f"r{i}", key={"task": f"t{i % 3}"}, at=T0 + 2 * i * S, expected=3) for i in range(9)]
    plain, recovered = GrouperState(), GrouperState()
    out_plain, out_recovered = [], []
    for r in arrivals:
        out_plain += [e.group for e in plain.add(r, CFG).emitted]
        recovered = GrouperState.from_bytes(recovered.to_bytes())
        out_recovered += [e.group for e in recovered.add(r, CFG).emitted]
    out_plain += [e.group for e in plain.close_due(T0 + 60 * S, CFG)]
    recovered = GrouperState.from_bytes(recovered.to_bytes())
    out_recovered += [e.group for e in recovered.close_due(T0 + 60 * S, CFG)]
    assert out_plain == out_recovered
    assert sorted(g["status"] for g in out_plain) == ["LATE"] * 3 + ["PARTIAL"] * 3


def test_shipped_grouping_config_loads() -> None:
    from processors.config import load_config

    cfg = load_config(GroupingConfig, "deploy/config/grouping.yaml")
    assert cfg == GroupingConfig() and cfg.window_us == 60 * S and cfg.grace_us == 10 * S
