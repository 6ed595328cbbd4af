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
"after finish" and "duplicate finish" errors).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from producers.gateway.errors import GatewayError, conflict, not_found
from producers.gateway.keys import API_KEY_PREFIX, derive_api_key, random_secret
from schemas.tokens import IDS_DTYPE, IdArray

log = logging.getLogger("tokentrail.gateway")

UNATTRIBUTED = "unattributed"
RECENT_CALLS = 2  # prompts kept per attempt (the rest of the history is referenced by call id)
UNATTRIBUTED_MAX_OUTPUTS = 16
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
# Rough fixed costs of the bookkeeping around the arrays (objects, dict slots, id strings), so that a
# budget also bounds millions of tiny attempts.
STATE_OVERHEAD_BYTES = 1024
ENTRY_OVERHEAD_BYTES = 256  # one kept call or output
TOMBSTONE_OVERHEAD_BYTES = 256
# Shedding stops below this share of the budget, so that a full registry does not shed on every call.
LOW_WATER = 0.9
EXPIRY_CHECK_INTERVAL_S = 1.0

__all__ = ["API_KEY_PREFIX", "UNATTRIBUTED", "AttemptRegistry", "AttemptState", "DeliveredCall",
           "MemoryLedger", "PriorSample", "SampledOutput"]


class MemoryLedger:
    """Bytes kept by the registry against its budget; ``on_over`` runs when an addition passes it."""

    def __init__(self, limit: int, on_over: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.used = 0
        self.on_over = on_over

    def add(self, nbytes: int) -> None:
        self.used += nbytes
        if nbytes > 0 and self.used > self.limit and self.on_over is not None:
            self.on_over()


@dataclass(frozen=True)
class SampledOutput:
    """One earlier call's exact sampled ids and what the harness was told they say (for splicing)."""

    call_id: str
    call_index: int
    output_ids: IdArray
    # The assistant message in the internal (OpenAI-style) chat form; None (rebuilt from Kafka): the
    # renderer parses it from the output ids, as the gateway did when it answered.
    message: dict[str, Any] | None

    @property
    def nbytes(self) -> int:
        size = len(orjson.dumps(self.message)) if self.message else 0
        return int(self.output_ids.nbytes) + size + ENTRY_OVERHEAD_BYTES


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

    @property
    def nbytes(self) -> int:
        text = len(self.prompt_text) if self.prompt_text else 0
        return int(self.prompt_ids.nbytes + self.output_ids.nbytes) + text + ENTRY_OVERHEAD_BYTES


@dataclass(frozen=True)
class PriorSample:
    """What the renderer may splice: an earlier output, with its prompt when it is still kept."""

    call_index: int
    prompt_ids: IdArray | None
    output_ids: IdArray
    message: dict[str, Any] | None
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
    recent: deque[DeliveredCall] = field(default_factory=deque)
    # Every successful call's output (newest ``max_outputs``), for splicing into later prompts.
    outputs: OrderedDict[int, SampledOutput] = field(default_factory=OrderedDict)
    max_outputs: int = 4096
    in_flight: int = 0
    # Scripted completions still to emit, one per call (POST /v1/rollouts ``script``; tests only).
    script: deque[str | list[int]] = field(default_factory=deque)
    # Whose content the attempt's records carry (POST /v1/rollouts ``subject``, an organic session's key);
    # None: nobody's (synthetic traffic). Every record of the attempt names it (docs/forgetting.md).
    subject: str | None = None
    # Where the bytes kept here are counted (the registry's budget); None: not counted.
    ledger: MemoryLedger | None = None
    retained_bytes: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    @property
    def key(self) -> tuple[str, str]:
        return (self.rollout_id, self.attempt_id)

    def check_open(self, what: str = "calls") -> None:
        """Refuse (409) what arrives after the finish: finished while a request's body was still arriving, an
        index taken now would be past the counts the AttemptFinished states (call_count, event_count)."""
        if self.finished:
            raise conflict(f"attempt {self.attempt_id} of rollout {self.rollout_id} was finished while "
                           f"this request arrived; no more {what} are accepted", code="attempt_finished")

    def begin_call(self) -> int:
        self.check_open("calls")
        index = self.next_call_index
        self.next_call_index += 1
        self.in_flight += 1
        self._idle.clear()
        self.last_seen = time.monotonic()
        return index

    def end_call(self) -> None:
        self.in_flight -= 1
        self.last_seen = time.monotonic()
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
        self.keep_prompt(delivered)
        if output is not None:
            self.keep_output(output)

    def keep_prompt(self, delivered: DeliveredCall) -> None:
        grown = delivered.nbytes
        self.recent.append(delivered)
        while len(self.recent) > RECENT_CALLS:
            grown -= self.recent.popleft().nbytes
        self._account(grown)

    def keep_output(self, output: SampledOutput) -> None:
        replaced = self.outputs.pop(output.call_index, None)
        grown = output.nbytes - (replaced.nbytes if replaced else 0)
        self.outputs[output.call_index] = output
        while len(self.outputs) > self.max_outputs:
            grown -= self.outputs.popitem(last=False)[1].nbytes
        self._account(grown)

    def drop_prompts(self) -> int:
        """Forget the kept prompts (memory pressure); later calls delta-encode and splice without them."""
        freed = sum(c.nbytes for c in self.recent)
        self.recent.clear()
        self._account(-freed)
        return freed

    def drop_outputs(self) -> int:
        """Forget the kept outputs (memory pressure); later prompts are rendered from their text."""
        freed = sum(o.nbytes for o in self.outputs.values())
        self.outputs.clear()
        self._account(-freed)
        return freed

    def release(self) -> int:
        """Everything this state keeps, given back (it is finished or dropped)."""
        self.recent.clear()
        self.outputs.clear()
        freed = self.retained_bytes
        self._account(-freed)
        return freed

    def _account(self, delta: int) -> None:
        self.retained_bytes += delta
        if self.ledger is not None and delta:
            self.ledger.add(delta)

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
            n = min(len(call.prompt_ids) + len(call.output_ids), len(prompt_ids))
            if n <= best_len:  # cannot share more than the best so far: not worth joining its ids
                continue
            seq = call.sequence
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
        state._account(STATE_OVERHEAD_BYTES + sum(len(s) for s in state.script))
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
        state._account(STATE_OVERHEAD_BYTES)
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
            state._account(STATE_OVERHEAD_BYTES)
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
