"""Per key: event-time windows of rewarded rollouts, a group baseline where a window is large enough, and a
running baseline where it is not.

Pure and deterministic: no clock, no Kafka. Time is event time (a member's time is its rollout's
completion time). The watermark is the largest event time seen minus ``watermark_lag_s``; it never goes
back. Each input is handled in two steps:

1. add: a member whose window has already closed (its window end, or for sliding windows its own due time,
   is at or below the watermark) is **late**: recorded, never used; a member already held or emitted is a
   re-delivery and changes nothing; any other is held.
2. close: every window whose end is at or below the watermark closes, in (end, id) order: a group of at
   least ``min_group_size`` rollouts gets advantages against the group (``GROUP``); a smaller one against
   the key's running baseline as it stood before the window (``RUNNING``). Then the running baseline
   takes the window's rewards, in (event time, rollout event id) order.

Each closed window is a ``BaselineWindow``: the state before and after, every member's baseline and
advantage, and an id that is a hash of what defines it (config, key, window, members, the previous
window's id), so the same members in any arrival order within the lag give the same windows, ids and
advantages (tests/processors/baselines: hypothesis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from processors.baselines.config import BaselineConfig
from schemas.ids import event_id

Record = dict[str, Any]
GROUP, RUNNING = "GROUP", "RUNNING"


@dataclass(frozen=True)
class Member:
    """A rewarded rollout attempt: what the baselines need of it."""

    rollout_event_id: str
    rollout_id: str
    reward_id: str  # the reward it was measured with (a feedback reward)
    reward: float
    event_us: int

    @property
    def order(self) -> tuple[int, str]:
        return (self.event_us, self.rollout_event_id)

    def to_data(self) -> list[Any]:
        return [self.rollout_event_id, self.rollout_id, self.reward_id, self.reward, self.event_us]

    @classmethod
    def of(cls, data: list[Any]) -> Member:
        return cls(str(data[0]), str(data[1]), str(data[2]), float(data[3]), int(data[4]))


@dataclass(frozen=True)
class RunningState:
    """A key's running baseline: how many rewards it has taken, their ewma (or the last ``last_n``), and
    the id of the window that last changed it."""

    count: int = 0
    mean: float | None = None
    recent: tuple[float, ...] = ()
    last_window_id: str | None = None

    def value(self, cfg: BaselineConfig) -> float | None:
        if self.count < cfg.running.min_history:
            return cfg.running.prior_mean
        if cfg.running.method == "ewma":
            return self.mean
        return math.fsum(self.recent) / len(self.recent)

    def taking(self, rewards: list[float], cfg: BaselineConfig, window_id: str) -> RunningState:
        mean, recent = self.mean, list(self.recent)
        alpha = cfg.running.alpha
        for r in rewards:
            if mean is None:
                prior = cfg.running.prior_mean
                mean = r if prior is None else (1 - alpha) * prior + alpha * r
            else:
                mean = (1 - alpha) * mean + alpha * r
            recent = [*recent, r][-cfg.running.last_n:]
        return RunningState(self.count + len(rewards), mean, tuple(recent), window_id)

    def to_data(self) -> list[Any]:
        return [self.count, self.mean, list(self.recent), self.last_window_id]

    @classmethod
    def of(cls, data: list[Any]) -> RunningState:
        return cls(int(data[0]), data[1], tuple(float(x) for x in data[2]), data[3])


@dataclass(frozen=True)
class BaselineWindow:
    """One closed window of one key: its members' advantages and what each was measured against."""

    event_id: str
    config_id: str
    key: str
    group_id: str
    window_start_us: int
    window_end_us: int
    method: str  # GROUP | RUNNING
    members: tuple[Member, ...]  # who gets an advantage here, in (event time, id) order
    peers: tuple[Member, ...]  # whose rewards a GROUP baseline is made of (RUNNING: none)
    baselines: tuple[float | None, ...]  # per member
    advantages: tuple[float | None, ...]  # per member; None: no baseline to measure against
    scale: float | None  # the divisor (group std + eps) when the group's advantages are scaled
    before: RunningState
    after: RunningState
    running_before: float | None  # the running baseline's value before the window (RUNNING: the baseline)
    running_after: float | None  # and after it took the window's rewards

    @property
    def created_at_us(self) -> int:
        return self.window_end_us


@dataclass(frozen=True)
class LateMember:
    member: Member
    key: str
    reason: str


Output = BaselineWindow | LateMember


def group_id_of(config_id: str, key: str, window_start_us: int, center: str | None = None) -> str:
    """The group a window forms: for tumbling windows the key and the window, for sliding ones the rollout
    it is centred on."""
    return event_id("baseline_group", config_id, key, window_start_us, center)


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def _clip(value: float, cfg: BaselineConfig) -> float:
    return value if cfg.clip is None else min(max(value, cfg.clip[0]), cfg.clip[1])


@dataclass
class KeyBaselines:
    """One key's windows and running baseline, folded one input at a time."""

    cfg: BaselineConfig
    key: str
    max_event_us: int | None = None
    pending: dict[str, Member] = field(default_factory=dict)  # held, not yet in a closed window
    retained: dict[str, Member] = field(default_factory=dict)  # sliding: emitted, still a peer of later ones
    done: dict[str, int] = field(default_factory=dict)  # emitted rollout event id -> forget it after
    running: RunningState = field(default_factory=RunningState)

    @property
    def watermark_us(self) -> int | None:
        return None if self.max_event_us is None else self.max_event_us - self.cfg.lag_us

    @property
    def _sliding(self) -> bool:
        return self.cfg.window.kind == "sliding"

    @property
    def _half_us(self) -> int:
        return self.cfg.window.size_us // 2

    def window_end_us(self, member: Member) -> int:
        """When the window that gives ``member`` its advantage closes (event time)."""
        if self._sliding:
            return member.event_us + self._half_us
        size = self.cfg.window.size_us
        return (member.event_us // size + 1) * size

    def next_due_us(self) -> int | None:
        """The earliest event time at which a ``tick`` changes something; None when nothing is held."""
        times = [self.window_end_us(m) for m in self.pending.values()]
        times += [m.event_us + self.cfg.window.size_us for m in self.retained.values()]
        times += list(self.done.values())
        return min(times) + self.cfg.lag_us if times else None

    @property
    def empty(self) -> bool:
        return not (self.pending or self.retained or self.done)

    # -- inputs ---------------------------------------------------------------------------------------

    def add(self, member: Member) -> list[Output]:
        out: list[Output] = []
        rid = member.rollout_event_id
        watermark = self.watermark_us
        if rid in self.pending or rid in self.retained or rid in self.done:
            pass  # a re-delivery
        elif watermark is not None and self.window_end_us(member) <= watermark:
            out.append(LateMember(member, self.key, "window_closed"))
        else:
            self.pending[rid] = member
        return out + self._advance(member.event_us)

    def tick(self, now_us: int) -> list[Output]:
        """Advance event time without an input (an idle key; the end of a replay)."""
        return self._advance(now_us)

    # -- steps ----------------------------------------------------------------------------------------

    def _advance(self, event_us: int) -> list[Output]:
        if self.max_event_us is None or event_us > self.max_event_us:
            self.max_event_us = event_us
        watermark = self.watermark_us
        assert watermark is not None
        out: list[Output] = []
        if self._sliding:
            for member in sorted((m for m in self.pending.values() if self.window_end_us(m) <= watermark),
                                 key=lambda m: m.order):
                out.append(self._close_sliding(member))
        else:
            ends = sorted({self.window_end_us(m) for m in self.pending.values() if self.window_end_us(m) <= watermark})
            for end in ends:
                out.append(self._close_tumbling(end))
        size = self.cfg.window.size_us
        self.retained = {k: m for k, m in self.retained.items() if m.event_us + size > watermark}
        self.done = {k: t for k, t in self.done.items() if t > watermark}
        return out

    def _close_tumbling(self, end_us: int) -> BaselineWindow:
        members = sorted((m for m in self.pending.values() if self.window_end_us(m) == end_us), key=lambda m: m.order)
        for m in members:
            del self.pending[m.rollout_event_id]
            self.done[m.rollout_event_id] = end_us + self.cfg.window.size_us
        start = end_us - self.cfg.window.size_us
        window = self._window(start, end_us, members, members, None)
        self.running = window.after
        return window

    def _close_sliding(self, center: Member) -> BaselineWindow:
        half = self._half_us
        known = [*self.pending.values(), *self.retained.values()]
        peers = sorted((m for m in known if center.event_us - half <= m.event_us < center.event_us + half),
                       key=lambda m: m.order)
        del self.pending[center.rollout_event_id]
        self.retained[center.rollout_event_id] = center
        window = self._window(center.event_us - half, center.event_us + half, [center], peers,
                              center.rollout_event_id)
        self.running = window.after
        return window

    def _window(self, start_us: int, end_us: int, members: list[Member], peers: list[Member],
                center: str | None) -> BaselineWindow:
        cfg, before = self.cfg, self.running
        config_id = cfg.id
        grouped = len(peers) >= cfg.min_group_size
        baselines: list[float | None]
        scale = None
        if grouped:
            rewards = [p.reward for p in peers]
            total = math.fsum(rewards)
            if cfg.group.baseline == "mean":
                baselines = [total / len(peers)] * len(members)
            else:
                baselines = [(total - m.reward) / (len(peers) - 1) for m in members]
            if cfg.group.scale_by_std:
                mean = total / len(peers)
                scale = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)) + cfg.group.eps
        else:
            peers = []
            baselines = [before.value(cfg)] * len(members)
        advantages = [None if b is None else _clip((m.reward - b) / (scale or 1.0), cfg)
                      for m, b in zip(members, baselines, strict=True)]
        wid = event_id("baseline", config_id, self.key, start_us, end_us, [m.reward_id for m in members],
                       [p.reward_id for p in peers], before.to_data())
        after = before.taking([m.reward for m in members], cfg, wid)
        return BaselineWindow(wid, config_id, self.key, group_id_of(config_id, self.key, start_us, center), start_us,
                              end_us, GROUP if grouped else RUNNING, tuple(members), tuple(peers), tuple(baselines),
                              tuple(advantages), scale, before, after, before.value(cfg), after.value(cfg))

    # -- state ----------------------------------------------------------------------------------------

    def snapshot(self) -> Record:
        return {"key": self.key, "max_event_us": self.max_event_us,
                "pending": [m.to_data() for m in self.pending.values()],
                "retained": [m.to_data() for m in self.retained.values()],
                "done": self.done, "running": self.running.to_data()}

    @classmethod
    def restore(cls, cfg: BaselineConfig, data: Record) -> KeyBaselines:
        state = cls(cfg, data["key"], data["max_event_us"])
        state.pending = {m.rollout_event_id: m for m in map(Member.of, data["pending"])}
        state.retained = {m.rollout_event_id: m for m in map(Member.of, data["retained"])}
        state.done = {k: int(v) for k, v in data["done"].items()}
        state.running = RunningState.of(data["running"])
        return state


def batch_windows(members: dict[str, list[Member]], cfg: BaselineConfig) -> list[BaselineWindow]:
    """Every key's windows from all its members at once, as replay derives them: each key's members in
    event-time order (nothing is late), then event time run past every window."""
    out: list[BaselineWindow] = []
    for key in sorted(members):
        state = KeyBaselines(cfg, key)
        unique = {m.rollout_event_id: m for m in members[key]}
        produced: list[Output] = []
        for member in sorted(unique.values(), key=lambda m: m.order):
            produced += state.add(member)
        if state.max_event_us is not None:
            produced += state.tick(state.max_event_us + cfg.lag_us + 2 * cfg.window.size_us + 1)
        out += [w for w in produced if isinstance(w, BaselineWindow)]
    return out


