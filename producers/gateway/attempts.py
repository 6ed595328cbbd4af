"""In-memory registry of rollouts and attempts: ids, per-rollout API keys, call and event counters.

The gateway assigns each call its index within the attempt and each environment event its index, so
the finish event can state exact counts. The counters live in this process, hence several gateway
replicas need rollout-sticky routing (by the path prefix, the X-Rollout-Id header or the API key).
A call or event that reaches a replica which does not know its attempt (wrong route, or a restart that
could not rebuild it) is refused with a 404 rather than given an index that could collide with one issued
elsewhere: a colliding deterministic call id would be silently deduplicated downstream. A restart rebuilds
the attempts from Kafka (recovery.py, ``restore``); the API keys are derived from a secret (keys.py), so
the keys minted before still work.

Memory is bounded in bytes (``max_bytes``): every attempt accounts what it keeps (prompt and output id
arrays, the assistant messages it may splice, its start). Over the budget, the least recently used idle
state is shed: first the kept prompts (delta bases), then the kept outputs (a later call then renders from
text: it is still served and recorded, with fewer spliced ids), then whole unattributed sessions, then the
oldest tombstones; a live attempt's counters and key are never shed. Failed calls keep nothing. An
unfinished attempt idle longer than ``idle_ttl_s`` is abandoned: its state and key are dropped and a later
call on it gets a clear 410 (``attempt_expired``). Finished attempts keep only a small tombstone (for
"after finish" and "duplicate finish" errors). One attempt's state and what it keeps: attempt_state.py.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from producers.gateway.attempt_state import (
    ENTRY_OVERHEAD_BYTES,
    STATE_OVERHEAD_BYTES,
    AttemptState,
    DeliveredCall,
    MemoryLedger,
    SampledOutput,
)
from producers.gateway.errors import GatewayError, conflict, not_found
from producers.gateway.keys import API_KEY_PREFIX, derive_api_key, random_secret

log = logging.getLogger("tokentrail.gateway")

UNATTRIBUTED = "unattributed"
UNATTRIBUTED_MAX_OUTPUTS = 16
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
TOMBSTONE_OVERHEAD_BYTES = 256  # beside the bookkeeping costs in attempt_state.py
# Shedding stops below this share of the budget, so that a full registry does not shed on every call.
LOW_WATER = 0.9
EXPIRY_CHECK_INTERVAL_S = 1.0

@dataclass
class RolloutInfo:
    latest_attempt_id: str
    latest_number: int
    start: dict[str, Any]  # what POST /v1/rollouts said (task input, group fields), reused by retries
    previous: RolloutInfo | None = None  # restored if this attempt's start cannot be delivered
    nbytes: int = 0  # counted against the budget


@dataclass(frozen=True)
class Tombstone:
    call_count: int
    event_count: int
    status: str


@dataclass(frozen=True)
class RestoredAttempt:
    """An attempt as rebuilt from Kafka (recovery.py): its counters, start and what later calls splice."""

    rollout_id: str
    attempt_id: str
    attempt_number: int
    start: dict[str, Any]
    next_call_index: int
    next_event_index: int
    finished: Tombstone | None = None
    recent: tuple[DeliveredCall, ...] = ()
    outputs: tuple[SampledOutput, ...] = ()
    last_activity_us: int = 0  # wall clock of its latest start, call or event (0: unknown)


class AttemptRegistry:
    def __init__(self, *, max_active: int = 100_000, max_tombstones: int = 200_000,
                 idle_ttl_s: float = 6 * 3600.0, max_sessions: int = 10_000,
                 max_bytes: int = DEFAULT_MAX_BYTES, key_secret: bytes | None = None) -> None:
        self.replica_id = uuid.uuid4().hex[:12]
        self._active: OrderedDict[tuple[str, str], AttemptState] = OrderedDict()
        self._rollouts: OrderedDict[str, RolloutInfo] = OrderedDict()
        # Keys of finished attempts stay resolvable (bounded) so their late calls get a clear 409.
        self._keys: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._finished: OrderedDict[tuple[str, str], Tombstone] = OrderedDict()
        # Attempts dropped after being idle too long: their later calls get a clear 410 (bounded).
        self._expired: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._sessions: OrderedDict[str, AttemptState] = OrderedDict()
        self.max_active, self.max_tombstones = max_active, max_tombstones
        self.idle_ttl_s, self.max_sessions = idle_ttl_s, max_sessions
        self.ledger = MemoryLedger(max_bytes, self._shed)
        self._key_secret = key_secret if key_secret is not None else random_secret()
        self._session_serial = 0
        self._next_expiry_check = 0.0
        self.shed_bytes = 0  # given back under memory pressure, ever (a metric)
        self.expired_count = 0  # unfinished attempts dropped after being idle, ever (a metric)
        self._warned_full = False

    @property
    def max_bytes(self) -> int:
        return self.ledger.limit

    @property
    def bytes_used(self) -> int:
        return self.ledger.used

    def api_key_for(self, rollout_id: str, attempt_id: str) -> str:
        return derive_api_key(self._key_secret, rollout_id, attempt_id)

    # -- lifecycle -------------------------------------------------------------------------------

    def forget_subject(self, subject: str) -> int:
        """Drop what the registry keeps of ``subject``'s content (prompts, outputs, scripts, task inputs of
        its rollouts) after a forget; later calls of its open attempts render from their text. The number of
        attempts and rollouts touched."""
        touched = 0
        for state in list(self._active.values()):
            if state.subject == subject:
                state.drop_prompts()
                state.drop_outputs()
                state.script.clear()
                touched += 1
        for rid, info in list(self._rollouts.items()):
            if info.start.get("subject") == subject:
                self._set_rollout(rid, RolloutInfo(info.latest_attempt_id, info.latest_number,
                                                   {**info.start, "task_input": {}, "script": None}, None,
                                                   _start_bytes(info.start)))
                touched += 1
        return touched

    def start(self, rollout_id: str | None, start: dict[str, Any]) -> AttemptState:
        """A new rollout (fresh id unless given) or, for a known rollout id, its next attempt."""
        self.expire_idle()
        rid = rollout_id or uuid.uuid4().hex
        previous = self._rollouts.get(rid)
        if previous is not None and (rid, previous.latest_attempt_id) in self._active:
            raise conflict(f"rollout {rid} already has an unfinished attempt {previous.latest_attempt_id}; "
                           "finish it first", code="attempt_in_progress")
        number = previous.latest_number + 1 if previous else 1
        attempt_id = uuid.uuid4().hex
        state = self._new_state(rid, attempt_id, number, script=deque(start.get("script") or ()),
                                subject=start.get("subject"))
        self._make_room_for_active()
        self._active[state.key] = state
        before = RolloutInfo(previous.latest_attempt_id, previous.latest_number, previous.start) \
            if previous else None
        self._set_rollout(rid, RolloutInfo(attempt_id, number, start, before, _start_bytes(start)))
        self._keys[state.api_key] = state.key
        return state

    def _new_state(self, rid: str, aid: str, number: int, **fields: Any) -> AttemptState:
        state = AttemptState(rollout_id=rid, attempt_id=aid, attempt_number=number,
                             api_key=self.api_key_for(rid, aid), **fields)
        state.ledger = self.ledger
        state.account(STATE_OVERHEAD_BYTES + sum(len(s) for s in state.script))
        return state

    def _set_rollout(self, rid: str, info: RolloutInfo) -> None:
        old = self._rollouts.pop(rid, None)
        self.ledger.add(-(old.nbytes if old else 0))
        self._rollouts[rid] = info
        self.ledger.add(info.nbytes)
        while len(self._rollouts) > self.max_active + self.max_tombstones:
            self._drop_rollout_info(next(iter(self._rollouts)))

    def _drop_rollout_info(self, rid: str) -> None:
        info = self._rollouts.pop(rid, None)
        if info is not None:
            self.ledger.add(-info.nbytes)

    def start_info(self, rollout_id: str) -> dict[str, Any]:
        info = self._rollouts.get(rollout_id)
        if info is None:
            raise not_found(f"unknown rollout {rollout_id!r}", code="unknown_rollout")
        return info.start

    def abandon(self, state: AttemptState) -> None:
        """Forget a just-started attempt whose start event could not be delivered."""
        if self._active.pop(state.key, None) is not None:
            state.release()
        self._keys.pop(state.api_key, None)
        info = self._rollouts.get(state.rollout_id)
        if info is not None and info.latest_attempt_id == state.attempt_id:
            if info.previous is None:
                self._drop_rollout_info(state.rollout_id)
            else:
                previous = info.previous
                previous.nbytes = _start_bytes(previous.start)
                self._set_rollout(state.rollout_id, previous)

    def finish(self, rollout_id: str, attempt_id: str, status: str) -> AttemptState:
        state = self.get_active(rollout_id, attempt_id, for_what="finish")
        state.finished = True
        del self._active[state.key]
        state.release()  # a finished attempt keeps only its tombstone
        self._bury(state.key, Tombstone(state.next_call_index, state.next_event_index, status))
        return state

    def _bury(self, key: tuple[str, str], tomb: Tombstone) -> None:
        if key not in self._finished:
            self.ledger.add(TOMBSTONE_OVERHEAD_BYTES)
        self._finished[key] = tomb
        while len(self._finished) > self.max_tombstones:
            self._drop_oldest_tombstone()
        while len(self._keys) > self.max_active + self.max_tombstones:
            self._keys.popitem(last=False)

    def _drop_oldest_tombstone(self) -> None:
        key, _ = self._finished.popitem(last=False)
        self.ledger.add(-TOMBSTONE_OVERHEAD_BYTES)
        self._keys.pop(self.api_key_for(*key), None)

    def unfinish(self, state: AttemptState) -> None:
        """Undo ``finish`` when its event could not be delivered, so the caller may retry it."""
        if self._finished.pop(state.key, None) is not None:
            self.ledger.add(-TOMBSTONE_OVERHEAD_BYTES)
        state.finished = False
        state.account(STATE_OVERHEAD_BYTES)
        self._active[state.key] = state
        self._keys[state.api_key] = state.key

    def restore(self, attempts: list[RestoredAttempt]) -> int:
        """Install attempts rebuilt from Kafka after a restart (recovery.py); returns how many are live.

        Unfinished ones become active again with their counters, key, kept prompts and outputs (unless idle
        past ``idle_ttl_s`` already: those stay expired); finished ones tombstones. An attempt this registry
        already knows is left as it is."""
        live = 0
        for r in sorted(attempts, key=lambda a: (a.rollout_id, a.attempt_number)):
            key = (r.rollout_id, r.attempt_id)
            if key in self._active or key in self._finished:
                continue
            info = self._rollouts.get(r.rollout_id)
            if info is None or info.latest_number <= r.attempt_number:
                self._set_rollout(r.rollout_id, RolloutInfo(r.attempt_id, r.attempt_number, r.start, None,
                                                            _start_bytes(r.start)))
            api_key = self.api_key_for(*key)
            self._keys[api_key] = key
            if r.finished is not None:
                self._bury(key, r.finished)
                continue
            idle_s = max(0.0, time.time() - r.last_activity_us / 1e6) if r.last_activity_us else 0.0
            if idle_s >= self.idle_ttl_s:  # abandoned before the restart: a restart does not revive it
                self._keys.pop(api_key, None)
                self._expired[key] = None
                continue
            state = self._new_state(r.rollout_id, r.attempt_id, r.attempt_number,
                                    next_call_index=r.next_call_index, next_event_index=r.next_event_index,
                                    subject=r.start.get("subject"))
            state.last_seen = time.monotonic() - idle_s  # its idle time goes on where it was
            for output in r.outputs:
                state.keep_output(output)
            for call in r.recent:
                state.keep_prompt(call)
            self._active[key] = state
            live += 1
        return live

    # -- lookups ---------------------------------------------------------------------------------

    def get_active(self, rollout_id: str, attempt_id: str, *, for_what: str = "call") -> AttemptState:
        self.expire_idle()
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
        if key in self._expired:
            raise GatewayError(410, f"attempt {attempt_id} of rollout {rollout_id} was idle longer than "
                               f"{self.idle_ttl_s:g} s and was dropped; start a new attempt "
                               f"(POST /v1/rollouts/{rollout_id}/attempts)", "not_found", code="attempt_expired")
        if rollout_id not in self._rollouts:
            raise not_found(f"unknown rollout {rollout_id!r}: start it with POST /v1/rollouts on this "
                            "gateway (replicas need rollout-sticky routing)", code="unknown_rollout")
        raise not_found(f"unknown attempt {attempt_id!r} of rollout {rollout_id!r} (not started on this "
                        "gateway)", code="unknown_attempt")

    def active(self, rollout_id: str, attempt_id: str) -> AttemptState | None:
        """The attempt if it is live here, else None; a look that touches nothing (no LRU, no idle time)."""
        return self._active.get((rollout_id, attempt_id))

    def active_states(self) -> list[AttemptState]:
        return list(self._active.values())

    def latest_attempt(self, rollout_id: str) -> tuple[str, int] | None:
        """The rollout's latest attempt id and number, None for a rollout this registry does not know."""
        info = self._rollouts.get(rollout_id)
        return None if info is None else (info.latest_attempt_id, info.latest_number)

    def latest_attempt_id(self, rollout_id: str) -> str:
        info = self._rollouts.get(rollout_id)
        if info is None:
            raise not_found(f"unknown rollout {rollout_id!r}: start it with POST /v1/rollouts",
                            code="unknown_rollout")
        return info.latest_attempt_id

    def by_api_key(self, api_key: str) -> tuple[str, str] | None:
        self.expire_idle()
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
                                 attempt_id=f"{self.replica_id}/{self._session_serial}/{session}",
                                 ledger=self.ledger)
            state.account(STATE_OVERHEAD_BYTES)
            self._sessions[session] = state
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)[1].release()
        else:
            self._sessions.move_to_end(session)
        return state

    def counts(self) -> dict[str, int]:
        return {"active": len(self._active), "finished": len(self._finished),
                "sessions": len(self._sessions)}

    def memory(self) -> dict[str, int]:
        """What /health shows: bytes counted against the budget, the budget, and what was given back."""
        return {"bytes": self.ledger.used, "max_bytes": self.ledger.limit, "shed_bytes": self.shed_bytes,
                "expired_attempts": self.expired_count}

    # -- bounds ----------------------------------------------------------------------------------

    def expire_idle(self, now: float | None = None) -> int:
        """Drop unfinished attempts idle longer than ``idle_ttl_s`` (their state and key); returns how many.

        Checked at most once a second (or a quarter of the timeout) on the request path; an attempt with
        a call in flight is never idle."""
        now = time.monotonic() if now is None else now
        if now < self._next_expiry_check:
            return 0
        self._next_expiry_check = now + min(EXPIRY_CHECK_INTERVAL_S, self.idle_ttl_s / 4)
        stale = _stale(self._active.values(), now, self.idle_ttl_s)
        for state in stale:
            self._expire(state)
        for session, state in list(self._sessions.items()):
            if now - state.last_seen < self.idle_ttl_s:
                break
            if not state.in_flight:
                del self._sessions[session]
                state.release()
        return len(stale)

    def _expire(self, state: AttemptState) -> None:
        del self._active[state.key]
        self._keys.pop(state.api_key, None)
        state.release()
        self._expired[state.key] = None
        while len(self._expired) > self.max_tombstones:
            self._expired.popitem(last=False)
        self.expired_count += 1
        log.info("attempt %s of rollout %s was idle for %.0f s: dropped", state.attempt_id, state.rollout_id,
                 self.idle_ttl_s)

    def _make_room_for_active(self) -> None:
        """``max_active`` bounds live attempts: the least recently used idle one is dropped as if expired."""
        while len(self._active) >= self.max_active:
            idle = next((s for s in self._active.values() if not s.in_flight), None)
            if idle is None:
                break
            self._expire(idle)

    def _idle_states(self) -> Iterator[AttemptState]:
        """Unattributed sessions first, then attempts, each least recently used first; none in flight."""
        for state in list(self._sessions.values()) + list(self._active.values()):
            if not state.in_flight:
                yield state

    def _shed(self) -> None:
        """Over the byte budget: give back the least recently used idle state until under the low-water
        mark. Never a live attempt's counters or key, never a call in flight."""
        target = int(self.ledger.limit * LOW_WATER)
        before = self.ledger.used
        for drop in (AttemptState.drop_prompts, AttemptState.drop_outputs):
            for state in self._idle_states():
                if self.ledger.used <= target:
                    break
                drop(state)
        for session, state in list(self._sessions.items()):
            if self.ledger.used <= target:
                break
            if not state.in_flight:
                del self._sessions[session]
                state.release()
        while self.ledger.used > target and self._finished:
            self._drop_oldest_tombstone()
        self.shed_bytes += before - self.ledger.used
        if self.ledger.used > self.ledger.limit and not self._warned_full:
            self._warned_full = True
            log.warning("attempt registry over its budget (%d > %d bytes) with nothing idle left to shed: "
                        "raise gateway.registry_max_bytes", self.ledger.used, self.ledger.limit)



def _stale(states: Iterable[AttemptState], now: float, ttl_s: float) -> list[AttemptState]:
    """Idle states past ``ttl_s``, walking least recently used first and stopping at the first recent one
    (the order follows lookups, so the walk is short; one out of order is only expired a little later)."""
    out = []
    for state in states:
        if now - state.last_seen < ttl_s:
            break
        if not state.in_flight:
            out.append(state)
    return out


def _start_bytes(start: dict[str, Any]) -> int:
    try:
        return len(orjson.dumps(start, option=orjson.OPT_NON_STR_KEYS)) + ENTRY_OVERHEAD_BYTES
    except (TypeError, orjson.JSONEncodeError):
        return STATE_OVERHEAD_BYTES
