"""Baseline windows (processors/baselines/windows.py): replay-safe and accounted for.

Properties (hypothesis, seeded): for any arrival order whose disorder stays within the watermark lag, with
ticks and snapshot/restore anywhere, a key's windows (ids, members, baselines, advantages, running state)
equal the batch computation replay uses; for any arrival order at all, every member ends in exactly one
window or is recorded late, none twice. Examples: a tumbling window against an independent computation,
running baselines (ewma, last-n, prior, min history), sliding windows, re-delivery, clipping and scaling."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.baselines.config import BaselineConfig
from processors.baselines.windows import (
    GROUP,
    RUNNING,
    BaselineWindow,
    KeyBaselines,
    LateMember,
    Member,
    Output,
    batch_windows,
)

PROPERTY = settings(derandomize=True, max_examples=200, deadline=None)
S = 1_000_000
KEY = "cluster:k"

configs = st.builds(
    lambda kind, size, lag, min_size, baseline, scale, method, prior, min_history: BaselineConfig(
        window={"kind": kind, "size_s": size}, watermark_lag_s=lag, min_group_size=min_size,
        group={"baseline": baseline, "scale_by_std": scale},
        running={"method": method, "alpha": 0.3, "last_n": 3, "prior_mean": prior, "min_history": min_history}),
    st.sampled_from(["tumbling", "sliding"]), st.integers(2, 12), st.integers(0, 6), st.integers(2, 4),
    st.sampled_from(["mean", "leave_one_out"]), st.booleans(), st.sampled_from(["ewma", "window"]),
    st.sampled_from([None, 0.5]), st.integers(1, 3))


@st.composite
def members(draw: st.DrawFn) -> list[Member]:
    times = draw(st.lists(st.integers(0, 60 * S), min_size=1, max_size=14))
    return [Member(f"e{i:02d}", f"r{i:02d}", f"w{i:02d}", float(draw(st.sampled_from([0.0, 0.5, 1.0]))), t)
            for i, t in enumerate(times)]


def fold(cfg: BaselineConfig, steps: list[tuple[str, object]], restore_every: int = 0) -> list[Output]:
    state, out = KeyBaselines(cfg, KEY), []
    for n, (kind, value) in enumerate(steps):
        out += state.add(value) if kind == "member" else state.tick(value)  # type: ignore[arg-type]
        if restore_every and n % restore_every == 0:
            state = KeyBaselines.restore(cfg, state.snapshot())
    if state.max_event_us is not None:
        out += state.tick(state.max_event_us + cfg.lag_us + 3 * cfg.window.size_us)
    assert not state.pending
    return out


@PROPERTY
@given(configs, members(), st.data())
def test_disorder_within_the_lag_gives_the_batch_windows(cfg: BaselineConfig, items: list[Member],
                                                         data: st.DataObject) -> None:
    # Each member arrives at its event time plus a delay of at most the lag; ticks at arrival times.
    delays = data.draw(st.lists(st.integers(0, cfg.lag_us), min_size=len(items), max_size=len(items)))
    ticks = data.draw(st.lists(st.booleans(), min_size=len(items), max_size=len(items)))
    arrivals = sorted(zip(items, delays, ticks, strict=True), key=lambda a: (a[0].event_us + a[1], a[0].reward_id))
    steps: list[tuple[str, object]] = []
    for member, delay, tick in arrivals:
        steps.append(("member", member))
        if tick:
            steps.append(("tick", member.event_us + delay))
    restore_every = data.draw(st.integers(0, 3))
    out = fold(cfg, steps, restore_every)
    assert not [o for o in out if isinstance(o, LateMember)]
    assert [o for o in out if isinstance(o, BaselineWindow)] == batch_windows({KEY: items}, cfg)


@PROPERTY
@given(configs, members(), st.data())
def test_any_order_measures_every_member_once_or_records_it_late(cfg: BaselineConfig, items: list[Member],
                                                                 data: st.DataObject) -> None:
    order = data.draw(st.permutations(items))
    steps: list[tuple[str, object]] = []
    for member in order:
        steps.append(("member", member))
        if data.draw(st.booleans()):
            steps.append(("tick", data.draw(st.integers(0, 70 * S))))
    steps.append(("member", order[0]))  # a re-delivery changes nothing
    out = fold(cfg, steps)
    measured = [m.rollout_event_id for o in out if isinstance(o, BaselineWindow) for m in o.members]
    late = [o.member.rollout_event_id for o in out if isinstance(o, LateMember)]
    assert len(measured) == len(set(measured))
    assert sorted(measured + [e for e in late if e not in measured]) == sorted(m.rollout_event_id for m in items)
    windows = [o for o in out if isinstance(o, BaselineWindow)]
    assert len({w.event_id for w in windows}) == len(windows)
    for before, after in itertools.pairwise(windows):  # the running state is one chain
        assert after.before == before.after and after.before.last_window_id == before.event_id


def m(i: int, reward: float, at_s: float) -> Member:
    return Member(f"e{i}", f"r{i}", f"w{i}", reward, round(at_s * S))


def reference_tumbling(cfg: BaselineConfig, items: list[Member]) -> list[tuple[str, list[float | None]]]:
    """An independent reading of the tumbling rule: per window in time order, leave-one-out over a large
    enough window, else the ewma of every earlier reward (no prior, min history 1)."""
    size, history, out = cfg.window.size_us, [], []
    for start in sorted({x.event_us // size for x in items}):
        window = sorted((x for x in items if x.event_us // size == start), key=lambda x: x.order)
        rewards = [x.reward for x in window]
        if len(window) >= cfg.min_group_size:
            out.append((GROUP, [r - (sum(rewards) - r) / (len(rewards) - 1) for r in rewards]))
        else:
            ewma = None
            for r in history:
                ewma = r if ewma is None else 0.9 * ewma + 0.1 * r
            out.append((RUNNING, [None if ewma is None else r - ewma for r in rewards]))
        history += rewards
    return out


def test_tumbling_windows_against_an_independent_computation() -> None:
    cfg = BaselineConfig(window={"size_s": 10}, min_group_size=3, watermark_lag_s=2)
    items = [m(1, 1.0, 1), m(2, 0.0, 2), m(3, 1.0, 9.9), m(4, 0.0, 12), m(5, 1.0, 25), m(6, 0.5, 31),
             m(7, 0.0, 33), m(8, 1.0, 38), m(9, 1.0, 47)]
    got = batch_windows({KEY: items}, cfg)
    want = reference_tumbling(cfg, items)
    assert [w.method for w in got] == [method for method, _ in want] == [GROUP, RUNNING, RUNNING, GROUP, RUNNING]
    for window, (_, advantages) in zip(got, want, strict=True):
        assert window.advantages == pytest.approx(advantages)
    assert got[1].running_before == pytest.approx(0.9 * 0.9 + 0.1 * 1.0 - 0.0)  # ewma of 1, 0, 1 = 0.91
    assert got[1].before.last_window_id == got[0].event_id
    assert got[0].group_id != got[1].group_id and got[0].window_end_us == 10 * S


def test_running_baseline_window_method_prior_and_min_history() -> None:
    lonely = [m(1, 1.0, 1), m(2, 0.0, 11), m(3, 1.0, 21), m(4, 1.0, 31), m(5, 0.0, 41)]
    cfg = BaselineConfig(window={"size_s": 10}, min_group_size=2,
                         running={"method": "window", "last_n": 2, "min_history": 2, "prior_mean": 0.25})
    got = batch_windows({KEY: lonely}, cfg)
    assert [w.method for w in got] == [RUNNING] * 5
    assert [w.baselines[0] for w in got] == [0.25, 0.25, 0.5, 0.5, 1.0]  # prior until 2 rewards, then last 2
    assert [w.advantages[0] for w in got] == [0.75, -0.25, 0.5, 0.5, -1.0]
    no_prior = batch_windows({KEY: lonely}, BaselineConfig(window={"size_s": 10}, min_group_size=2))
    assert no_prior[0].advantages == (None,) and no_prior[1].advantages == (-1.0,)


def test_sliding_windows_centre_each_rollout_among_its_neighbours() -> None:
    cfg = BaselineConfig(window={"kind": "sliding", "size_s": 10}, min_group_size=3, group={"baseline": "mean"})
    items = [m(1, 1.0, 0), m(2, 0.0, 3), m(3, 1.0, 4), m(4, 0.0, 20)]
    got = batch_windows({KEY: items}, cfg)
    assert [w.members[0].rollout_id for w in got] == ["r1", "r2", "r3", "r4"]
    assert [w.method for w in got] == [GROUP, GROUP, GROUP, RUNNING]
    assert [len(w.peers) for w in got[:3]] == [3, 3, 3]
    assert got[0].advantages[0] == pytest.approx(1 - 2 / 3)
    assert len({w.group_id for w in got}) == 4  # one group per centred rollout


def test_group_advantages_scaled_and_clipped() -> None:
    cfg = BaselineConfig(window={"size_s": 10}, min_group_size=2, group={"baseline": "mean", "scale_by_std": True,
                                                                       "eps": 0.0}, clip=(-0.6, 0.5))
    (window,) = batch_windows({KEY: [m(1, 1.0, 1), m(2, 0.0, 2), m(3, 0.0, 3), m(4, 0.0, 4)]}, cfg)
    std = math.sqrt(3 / 16)
    assert window.scale == pytest.approx(std)
    assert window.advantages == pytest.approx([0.5, -0.25 / std, -0.25 / std, -0.25 / std])
    assert window.advantages[0] == 0.5  # clipped from 0.75 / std; the others (-0.58) within the clip


def test_late_member_is_recorded_and_redelivery_changes_nothing() -> None:
    cfg = BaselineConfig(window={"size_s": 10}, min_group_size=2, watermark_lag_s=1)
    state = KeyBaselines(cfg, KEY)
    assert state.add(m(1, 1.0, 1)) == [] and state.add(m(2, 0.0, 2)) == []
    (closed,) = state.add(m(3, 1.0, 15))  # watermark 14 s: [0, 10) closes
    assert isinstance(closed, BaselineWindow) and closed.method == GROUP and len(closed.members) == 2
    assert state.add(m(1, 1.0, 1)) == []  # the same member again: already measured
    (late,) = state.add(m(4, 0.0, 5))
    assert isinstance(late, LateMember) and late.member.rollout_id == "r4" and late.reason == "window_closed"
    (good,) = state.tick(25 * S)  # the member after the late one is still measured
    assert good.members[0].rollout_id == "r3" and good.method == RUNNING and good.before.count == 2
