"""In-memory registry of rollouts and attempts: ids, per-rollout API keys, call and event counters.

The gateway assigns each call its index within the attempt and each environment event its index, so
the finish event can state exact counts. The counters live in this process, hence several gateway
replicas need rollout-sticky routing (by the path prefix, the X-Rollout-Id header or the API key).
A call or event that reaches a replica which never started its attempt (wrong route, or a restart) is
refused with a 404 rather than given an index that could collide with one issued elsewhere: a
colliding deterministic call id would be silently deduplicated downstream.

Memory is bounded: finished attempts keep only a small tombstone (for "after finish" and "duplicate
finish" errors); active attempts beyond ``max_active`` or idle longer than ``idle_ttl_s`` are evicted
(oldest first) and their later calls are refused; per attempt only the last few delivered token
sequences are kept as delta bases.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from producers.gateway.errors import conflict, not_found
from schemas.tokens import IDS_DTYPE, IdArray

UNATTRIBUTED = "unattributed"
RECENT_CALLS = 2  # prompts kept per attempt (the rest of the history is referenced by call id)
UNATTRIBUTED_MAX_OUTPUTS = 16
API_KEY_PREFIX = "tt-"


@dataclass(frozen=True)
class SampledOutput:
    """One earlier call's exact sampled ids and what the harness was told they say (for splicing)."""

    call_id: str
    call_index: int
    output_ids: IdArray
    message: dict[str, Any]  # the assistant message in the internal (OpenAI-style) chat form


@dataclass(frozen=True)
class DeliveredCall:
    call_id: str
    call_index: int
    prompt_ids: IdArray
    output_ids: IdArray
    prompt_text: str | None = None  # what the prompt ids stand for, when the text side proved it

    @property
    def sequence(self) -> IdArray:
        return np.concatenate([self.prompt_ids, self.output_ids]).astype(IDS_DTYPE, copy=False)


@dataclass(frozen=True)
class PriorSample:
    """What the renderer may splice: an earlier output, with its prompt when it is still kept."""

    call_index: int
    prompt_ids: IdArray | None
    output_ids: IdArray
    message: dict[str, Any]
    prompt_text: str | None = None


@dataclass
class AttemptState:
    rollout_id: str
    attempt_id: str
    attempt_number: int = 1
    api_key: str = ""
    started: bool = True  # False for the pseudo-attempts that hold unattributed calls
    next_call_index: int = 0
    next_event_index: int = 0
    finished: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    # The last delivered calls with their prompts, newest last: delta bases and splice prefixes.
    recent: deque[DeliveredCall] = field(default_factory=lambda: deque(maxlen=RECENT_CALLS))
    # Every successful call's output (newest ``max_outputs``), for splicing into later prompts.
    outputs: OrderedDict[int, SampledOutput] = field(default_factory=OrderedDict)
    max_outputs: int = 4096
    in_flight: int = 0
    # Scripted completions still to emit, one per call (POST /v1/rollouts ``script``; tests only).
    script: deque[str] = field(default_factory=deque)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    @property
    def key(self) -> tuple[str, str]:
        return (self.rollout_id, self.attempt_id)

    def begin_call(self) -> int:
        # Finished while this call's body was still arriving: an index now would be past the finish's count.
        if self.finished:
            raise conflict(f"attempt {self.attempt_id} of rollout {self.rollout_id} was finished while "
                           "this call arrived; no more calls are accepted", code="attempt_finished")
        index = self.next_call_index
        self.next_call_index += 1
        self.in_flight += 1
        self._idle.clear()
        self.last_seen = time.monotonic()
        return index

    def end_call(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait for in-flight calls to finish delivering; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def remember(self, delivered: DeliveredCall, output: SampledOutput | None) -> None:
        """A call was delivered: keep it as a delta base and its output for splicing."""
        self.recent.append(delivered)
        if output is not None:
            self.outputs[output.call_index] = output
            while len(self.outputs) > self.max_outputs:
                self.outputs.popitem(last=False)

    def prior_calls(self) -> list[PriorSample]:
        recent = {c.call_index: c for c in self.recent}
        out = []
        for o in self.outputs.values():
            kept = recent.get(o.call_index)
            out.append(PriorSample(o.call_index, kept.prompt_ids if kept else None, o.output_ids, o.message,
                                   kept.prompt_text if kept else None))
        return out

    def best_base(self, prompt_ids: IdArray) -> tuple[str | None, IdArray | None]:
        """The kept call whose prompt ‖ output shares the longest prefix with ``prompt_ids``."""
        best: tuple[str | None, IdArray | None] = (None, None)
        best_len = -1
        for call in reversed(self.recent):
            seq = call.sequence
            n = min(len(seq), len(prompt_ids))
            diff = np.flatnonzero(seq[:n] != prompt_ids[:n])
            shared = int(diff[0]) if diff.size else n
            if shared > best_len:
                best, best_len = (call.call_id, seq), shared
        return best


@dataclass
class RolloutInfo:
    latest_attempt_id: str
    latest_number: int
    start: dict[str, Any]  # what POST /v1/rollouts said (task input, group fields), reused by retries
    previous: RolloutInfo | None = None  # restored if this attempt's start cannot be delivered


@dataclass(frozen=True)
class Tombstone:
    call_count: int
    event_count: int
    status: str


class AttemptRegistry:
    def __init__(self, *, max_active: int = 100_000, max_tombstones: int = 200_000,
                 idle_ttl_s: float = 24 * 3600.0, max_sessions: int = 10_000) -> None:
        self.replica_id = uuid.uuid4().hex[:12]
        self._active: OrderedDict[tuple[str, str], AttemptState] = OrderedDict()
        self._rollouts: OrderedDict[str, RolloutInfo] = OrderedDict()
        # Keys of finished attempts stay resolvable (bounded) so their late calls get a clear 409.
        self._keys: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._finished: OrderedDict[tuple[str, str], Tombstone] = OrderedDict()
        self._sessions: OrderedDict[str, AttemptState] = OrderedDict()
        self.max_active, self.max_tombstones = max_active, max_tombstones
        self.idle_ttl_s, self.max_sessions = idle_ttl_s, max_sessions
        self._session_serial = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, rollout_id: str | None, start: dict[str, Any]) -> AttemptState:
        """A new rollout (fresh id unless given) or, for a known rollout id, its next attempt."""
        rid = rollout_id or uuid.uuid4().hex
        previous = self._rollouts.get(rid)
        if previous is not None and (rid, previous.latest_attempt_id) in self._active:
            raise conflict(f"rollout {rid} already has an unfinished attempt {previous.latest_attempt_id}; "
                           "finish it first", code="attempt_in_progress")
        number = previous.latest_number + 1 if previous else 1
        state = AttemptState(rollout_id=rid, attempt_id=uuid.uuid4().hex, attempt_number=number,
                             api_key=API_KEY_PREFIX + secrets.token_urlsafe(24),
                             script=deque(start.get("script") or ()))
        self._evict_idle()
        self._active[state.key] = state
        before = RolloutInfo(previous.latest_attempt_id, previous.latest_number, previous.start) \
            if previous else None
        self._rollouts[rid] = RolloutInfo(state.attempt_id, number, start, before)
        self._rollouts.move_to_end(rid)
        while len(self._rollouts) > self.max_active + self.max_tombstones:
            self._rollouts.popitem(last=False)
        self._keys[state.api_key] = state.key
        return state

    def start_info(self, rollout_id: str) -> dict[str, Any]:
        info = self._rollouts.get(rollout_id)
        if info is None:
            raise not_found(f"unknown rollout {rollout_id!r}", code="unknown_rollout")
        return info.start

    def abandon(self, state: AttemptState) -> None:
        """Forget a just-started attempt whose start event could not be delivered."""
        self._active.pop(state.key, None)
        self._keys.pop(state.api_key, None)
        info = self._rollouts.get(state.rollout_id)
        if info is not None and info.latest_attempt_id == state.attempt_id:
            if info.previous is None:
                del self._rollouts[state.rollout_id]
            else:
                self._rollouts[state.rollout_id] = info.previous

    def finish(self, rollout_id: str, attempt_id: str, status: str) -> AttemptState:
        state = self.get_active(rollout_id, attempt_id, for_what="finish")
        state.finished = True
        del self._active[state.key]
        self._finished[state.key] = Tombstone(state.next_call_index, state.next_event_index, status)
        while len(self._finished) > self.max_tombstones:
            self._finished.popitem(last=False)
        while len(self._keys) > self.max_active + self.max_tombstones:
            self._keys.popitem(last=False)
        return state

    def unfinish(self, state: AttemptState) -> None:
        """Undo ``finish`` when its event could not be delivered, so the caller may retry it."""
        self._finished.pop(state.key, None)
        state.finished = False
        self._active[state.key] = state

    # -- lookups ---------------------------------------------------------------------------------

    def get_active(self, rollout_id: str, attempt_id: str, *, for_what: str = "call") -> AttemptState:
        key = (rollout_id, attempt_id)
        state = self._active.get(key)
        if state is not None:
            state.last_seen = time.monotonic()
            self._active.move_to_end(key)
            return state
        tomb = self._finished.get(key)
        if tomb is not None:
            if for_what == "finish":
                raise conflict(f"attempt {attempt_id} of rollout {rollout_id} is already finished "
                               f"({tomb.status})", code="attempt_finished")
            raise conflict(f"attempt {attempt_id} of rollout {rollout_id} is finished ({tomb.status}); "
                           f"no more {for_what}s are accepted", code="attempt_finished")
        if rollout_id not in self._rollouts:
            raise not_found(f"unknown rollout {rollout_id!r}: start it with POST /v1/rollouts on this "
                            "gateway (replicas need rollout-sticky routing)", code="unknown_rollout")
        raise not_found(f"unknown attempt {attempt_id!r} of rollout {rollout_id!r} (not started, or "
                        "evicted after being idle)", code="unknown_attempt")

    def latest_attempt_id(self, rollout_id: str) -> str:
        info = self._rollouts.get(rollout_id)
        if info is None:
            raise not_found(f"unknown rollout {rollout_id!r}: start it with POST /v1/rollouts",
                            code="unknown_rollout")
        return info.latest_attempt_id

    def by_api_key(self, api_key: str) -> tuple[str, str] | None:
        return self._keys.get(api_key)

    def is_minted_key(self, api_key: str) -> bool:
        return api_key.startswith(API_KEY_PREFIX)

    def unattributed(self, session_id: str | None) -> AttemptState:
        """The pseudo-attempt holding unattributed calls: one per harness session on this replica.

        Its id carries the replica id and a creation number, so a session evicted and seen again,
        a restart or another replica never reuses an attempt id (and so never a call id).
        """
        session = session_id or "no-session"
        state = self._sessions.get(session)
        if state is None:
            self._session_serial += 1
            state = AttemptState(rollout_id=UNATTRIBUTED, started=False, max_outputs=UNATTRIBUTED_MAX_OUTPUTS,
                                 attempt_id=f"{self.replica_id}/{self._session_serial}/{session}")
            self._sessions[session] = state
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session)
        return state

    def counts(self) -> dict[str, int]:
        return {"active": len(self._active), "finished": len(self._finished),
                "sessions": len(self._sessions)}

    def _evict_idle(self) -> None:
        now = time.monotonic()
        while self._active:
            key, oldest = next(iter(self._active.items()))
            if len(self._active) < self.max_active and now - oldest.last_seen < self.idle_ttl_s:
                break
            if oldest.in_flight:
                break
            del self._active[key]

