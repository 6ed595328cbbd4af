"""Organic sessions: calls that name no rollout become real rollout attempts, keyed by their session.

Production traffic never calls ``POST /v1/rollouts``. With ``gateway.organic_sessions`` a call that names
no attempt (no path prefix, no ``X-Rollout-Id``, no minted key) but carries a session key joins that
session's attempt. The key is the first match of ``gateway.session_key_sources``, in its order (default:
a harness session header (``identity.SESSION_HEADERS``), the OpenAI body's ``user``, the Anthropic body's
``metadata.user_id``). ``api_key`` makes the API key the caller presented its tenant's key, for deployments
whose auth proxy gives each tenant a key: the key stands for itself only as a hash (``api-key:`` + 24 hex of
its sha256), so no secret reaches a record; the operator's admin key is nobody's tenant and never counts.

Each session window is a rollout of its own: a key's sessions follow each other (a user comes back
tomorrow), and the processors count and train on one attempt per rollout, so later windows must not be
later attempts of one rollout. The rollout id is ``session-`` + a keyed hash of the key + a keyed hash of the
key and the window's first call time (``SessionRefs.rollout_id_for``): the same for every record of the
window, and the key's windows share the middle part (``SessionRefs.key_part``), so what they have in common is
visible in the id. The
window's start time is in the ``AttemptStarted`` metadata, so a restart that rebuilds the open window from
Kafka (recovery.py) finds the same rollout (``adopt``).

The window's first call starts its attempt (attempt 1 of its rollout) and puts its ``AttemptStarted`` on
Kafka (the same code path as ``POST /v1/rollouts``; empty task input; metadata ``organic``, ``session_ref``
(``session_ref``: an HMAC of the key under ``gateway.session_ref_key``, behind its tenant's scope; never the key
itself, which may be a user id, nor a plain hash of it, which would confirm a guessed one; session_refs.py),
``session_source`` and ``window_start_us``) before that call gets its index. The attempt ends with an
``AttemptFinished`` stating the counts (status SUCCESS, as the schema has no dedicated one;
``final_artifacts`` says how it ended) on ``POST /v1/sessions/{key}/end``, or after ``gateway.session_idle_s``
with no call (swept in the background, as the registry expires idle attempts).
A later call with the same key opens the key's next window: a new rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from producers.gateway.attempt_state import AttemptState
from producers.gateway.body import validate
from producers.gateway.env_api import EnvApi, Finish
from producers.gateway.errors import GatewayError, not_found
from producers.gateway.identity import SESSION_HEADERS, is_admin, presented_key
from producers.gateway.keys import ORGANIC_ROLLOUT_PREFIX
from producers.gateway.session_refs import SessionRefs
from producers.gateway.tenants import Tenants

log = logging.getLogger("tokentrail.gateway")

ROLLOUT_PREFIX = ORGANIC_ROLLOUT_PREFIX  # keys.owner_key reads the key part back out of the rollout id
MAX_KEY_CHARS = 200
SWEEP_INTERVAL_S = 1.0


KEY_SOURCES = ("headers", "openai.user", "anthropic.metadata.user_id", "api_key")
DEFAULT_KEY_SOURCES = ("headers", "openai.user", "anthropic.metadata.user_id")


def session_key(headers: Mapping[str, str], body: Mapping[str, Any], protocol: str,
                sources: Sequence[str] = DEFAULT_KEY_SOURCES, admin_key: str = "") -> tuple[str, str] | None:
    """The call's session key and where it came from, first match of ``sources`` in their order; None when
    it carries none."""
    for source in sources:
        found = _from_source(source, headers, body, protocol, admin_key)
        if found is not None:
            return found
    return None


def _from_source(source: str, headers: Mapping[str, str], body: Mapping[str, Any], protocol: str,
                 admin_key: str) -> tuple[str, str] | None:
    if source == "headers":
        for name in SESSION_HEADERS:
            value = headers.get(name)
            if value:
                return value[:MAX_KEY_CHARS], f"header:{name}"
    elif source == "openai.user" and protocol == "openai":
        user = body.get("user")
        if isinstance(user, str) and user:
            return user[:MAX_KEY_CHARS], source
    elif source == "anthropic.metadata.user_id" and protocol == "anthropic":
        metadata = body.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
        if isinstance(user_id, str) and user_id:
            return user_id[:MAX_KEY_CHARS], source
    elif source == "api_key":
        key = presented_key(headers)
        if key and not is_admin(key, admin_key):
            return "api-key:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:24], source
    return None


def ref_of_start(metadata: Mapping[str, Any], refs: SessionRefs) -> str | None:
    """The session ref of an organic attempt from its AttemptStarted metadata; None for any other attempt.
    An AttemptStarted written before refs carries the key itself (``session``): its ref is computed. A ref
    written under another key (before a rotation of ``gateway.session_ref_key``) is returned as written: it
    matches no key's ref now, so its window is only swept when idle (docs/feedback.md)."""
    if not metadata.get("organic"):
        return None
    ref, key = metadata.get("session_ref"), metadata.get("session")
    if isinstance(ref, str):
        return ref
    return refs.ref(key) if isinstance(key, str) else None


class OrganicSessions:
    """Starts, finds and ends the attempts of organic sessions; ``env`` publishes their starts and finishes."""

    def __init__(self, env: EnvApi, idle_s: float, refs: SessionRefs) -> None:
        self.env, self.ctx, self.idle_s, self.refs = env, env.ctx, idle_s, refs
        # By the session's ref (session_ref): the keys themselves are not kept.
        self._open: dict[str, AttemptState] = {}  # session ref -> its current window's attempt (swept)
        self._key_of: dict[str, str] = {}  # rollout id of an open window -> its session ref
        self._locks: dict[str, asyncio.Lock] = {}  # one start at a time per session
        # Ends in progress: a sweep, an end request and a call that finds the session stale share one.
        self._ending: dict[tuple[str, str], asyncio.Future[dict[str, Any]]] = {}
        self.started = 0
        self.ended = 0

    # -- calls -----------------------------------------------------------------------------------

    def current(self, key: str) -> AttemptState | None:
        """The key's live window, if any (no start; for count_tokens)."""
        state = self._live(self.refs.ref(key))
        if state is not None and not self._stale(state):
            # Through get_active, so the registry's LRU order (idle expiry, room for new attempts) sees the use.
            return self.ctx.registry.get_active(state.rollout_id, state.attempt_id)
        return None

    async def attempt_for(self, key: str, source: str) -> AttemptState:
        """The key's live window's attempt; a new window (a new rollout, its AttemptStarted delivered) when
        it has none or its last one has been idle for ``idle_s``."""
        state = self.current(key)
        if state is not None:
            return state
        ref = self.refs.ref(key)
        lock = self._locks.setdefault(ref, asyncio.Lock())
        try:
            async with lock:  # concurrent first calls: one start, the others join it
                state = self.current(key)
                if state is not None:
                    return state
                stale = self._live(ref)
                if stale is not None:  # idle past the window but not swept yet: that window is over
                    await self._end(stale, "idle")
                tenant = Tenants.tenant_of_session(key)
                if tenant is not None:  # a tenant's open windows are capped apart from RL attempts (tenants.py)
                    self.ctx.tenants.check_room(tenant)
                window_start_us = time.time_ns() // 1000
                start = {"task_input": {}, "group_id": None, "group_key": {}, "expected_group_size": None,
                         "metadata": {"organic": True, "session_ref": ref, "session_source": source,
                                      "window_start_us": window_start_us},
                         # the user's (or the tenant's) content: forgettable under this key, stored as its
                         # keyed pseudonym (a reader of the records learns no user id)
                         "subject": self.ctx.subjects.stored(key)}
                state = self.ctx.registry.start(self.refs.rollout_id_for(key, window_start_us), start)
                await self.env.publish_start(state, start)
                self._hold(ref, state)
                self.started += 1
                return state
        finally:
            if not lock.locked() and self._locks.get(ref) is lock:
                del self._locks[ref]

    def _live(self, ref: str) -> AttemptState | None:
        """The session's current window if its attempt is still live in the registry (else forgotten here)."""
        state = self._open.get(ref)
        if state is None:
            return None
        if self.ctx.registry.active(state.rollout_id, state.attempt_id) is not state:
            self._release(state)  # finished or dropped by other means
            return None
        return state

    def _hold(self, ref: str, state: AttemptState) -> None:
        previous = self._open.get(ref)
        if previous is not None:
            self._key_of.pop(previous.rollout_id, None)
        elif (tenant := Tenants.tenant_of_session(ref)) is not None:
            self.ctx.tenants.open[tenant] += 1
        self._open[ref], self._key_of[state.rollout_id] = state, ref

    def _release(self, state: AttemptState) -> None:
        ref = self._key_of.pop(state.rollout_id, None)
        if ref is not None and self._open.get(ref) is state:
            del self._open[ref]
            if (tenant := Tenants.tenant_of_session(ref)) is not None:
                self.ctx.tenants.open[tenant] -= 1

    def _stale(self, state: AttemptState) -> bool:
        return not state.in_flight and time.monotonic() - state.last_seen >= self.idle_s

    # -- ends ------------------------------------------------------------------------------------

    async def _end(self, state: AttemptState, how: str, status: str = "SUCCESS",
                   final_artifacts: Any = None) -> dict[str, Any]:
        """Finish the session's attempt once: whoever comes while its end is being recorded gets that end's
        record (else the second finish would be refused as a duplicate)."""
        pending = self._ending.get(state.key)
        if pending is None:
            pending = asyncio.ensure_future(self._finish(state, how, status, final_artifacts))
            self._ending[state.key] = pending
            pending.add_done_callback(lambda _done, key=state.key: self._ending.pop(key, None))
        return await asyncio.shield(pending)

    async def _finish(self, state: AttemptState, how: str, status: str, final_artifacts: Any) -> dict[str, Any]:
        artifacts = {"organic": {"ended_by": how}} if final_artifacts is None else final_artifacts
        record = await self.env.publish_finish(state, status, artifacts)
        self._release(state)
        self.ended += 1
        log.info("organic session %s ended (%s): %d calls", state.rollout_id, how, record["call_count"])
        return record

    async def sweep(self) -> int:
        """End the sessions idle for ``idle_s``; returns how many ended. Attempts finished or dropped by
        other means are only forgotten here."""
        ended = 0
        for ref in list(self._open):
            state = self._live(ref)
            if state is None or not self._stale(state):
                continue
            try:
                await self._end(state, "idle")
                ended += 1
            except GatewayError as exc:  # e.g. Kafka and spool both refuse: tried again next sweep
                log.warning("organic session %s: idle end not recorded yet: %s", state.rollout_id, exc.message)
        return ended

    async def run_sweeper(self) -> None:
        interval = max(0.02, min(SWEEP_INTERVAL_S, self.idle_s / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sweep()
            except Exception:  # the sweeper must outlive one bad sweep
                log.exception("organic session sweep failed")

    def adopt(self) -> int:
        """Sweep the organic attempts a restart rebuilt from Kafka (recovery.py) too."""
        adopted = 0
        for state in self.ctx.registry.active_states():
            if not state.rollout_id.startswith(ROLLOUT_PREFIX):
                continue
            with contextlib.suppress(GatewayError):
                metadata = self.ctx.registry.start_info(state.rollout_id).get("metadata") or {}
                ref = ref_of_start(metadata, self.refs)
                if ref is None:
                    continue
                held = self._open.get(ref)
                if held is state:
                    continue
                if held is not None and held.last_seen >= state.last_seen:
                    continue  # two open windows of a key (a crash between an end and a start): the newer wins
                self._hold(ref, state)
                adopted += 1
        return adopted

    def counts(self) -> dict[str, int]:
        """Open windows now, windows started and ended since this process started."""
        return {"open": len(self._open), "started": self.started, "ended": self.ended}

    # -- POST /v1/sessions/{key}/end ---------------------------------------------------------------

    def routes(self) -> list[Route]:
        return [Route("/v1/sessions/{key:path}/end", self.end_route, methods=["POST"])]

    async def end_route(self, request: Request) -> JSONResponse:
        key = request.path_params["key"][:MAX_KEY_CHARS]
        try:
            presented = presented_key(request.headers)
            tenant = self.ctx.tenants.of(presented) if self.ctx.tenants else None
            if tenant is not None:  # a tenant names its own sessions: another tenant's are not there for it
                key = Tenants.scope(tenant, key)
            elif self.ctx.admin_key and not is_admin(presented, self.ctx.admin_key):
                raise GatewayError(401, "ending a session needs a tenant key or the gateway admin key",
                                   "authentication", code="invalid_api_key")
            elif Tenants.tenant_of_session(key) and not is_admin(presented, self.ctx.admin_key):
                # as for calls (app._session_key): else a caller without a key ends a tenant's session by name
                raise GatewayError(403, "session keys beginning 'tenant:' are the tenants' own", "permission",
                                   code="wrong_tenant")
            body = validate(Finish, await self.ctx.body_checks.read_json(request, self.ctx.max_body_bytes,
                                                                          model=Finish, allow_empty=True))
            state = self._live(self.refs.ref(key))
            if state is None:
                raise not_found("no open session for this key", code="unknown_session")
            rid = state.rollout_id
            artifacts = body.final_artifacts if "final_artifacts" in body.model_fields_set else None
            record = await self._end(state, "request", body.status, artifacts)
        except GatewayError as exc:
            return JSONResponse(exc.body("openai"), status_code=exc.status)
        return JSONResponse({"rollout_id": rid, "attempt_id": state.attempt_id,
                             "attempt_number": state.attempt_number, "status": record["status"],
                             "call_count": record["call_count"], "event_count": record["event_count"],
                             "event_id": record["event_id"]})

