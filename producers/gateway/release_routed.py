"""An upstream that serves each rollout the policy version its release assigns (docs/release.md).

The session key (``session_key``) is the rollout id: every call of a rollout (all its attempts and turns,
one user session of an agent) is routed alike, so a rollout's tokens come from one version, which is what
the release controller compares (it leaves out rollouts served by several versions). Calls that name no
rollout are keyed by the harness's session id (one user's conversation), else each call by its own id.
``route`` is sticky, so a session keeps its version while the candidate's fraction ramps up; a rollback or
promotion moves it at its next call.

The version goes to the upstream in ``GenerateRequest.policy_version``; the embedded engine honours it
(and is told which versions to keep resident whenever the plan changes); an upstream that serves one
version ignores it, and the record always carries the version that produced the tokens. Everything else
(``max_model_len``, ``logprob_kind``, ``follow_policies``, ...) is the wrapped upstream's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from producers.gateway.attempts import UNATTRIBUTED
from producers.gateway.release_follower import ReleaseFollower
from producers.upstreams.base import (
    ChatGenerateRequest,
    GenerateRequest,
    GenerateResult,
    TokenChunk,
    Upstream,
    UpstreamError,
)
from schemas.release_traffic import Traffic

log = logging.getLogger(__name__)
Request = TypeVar("Request", GenerateRequest, ChatGenerateRequest)


def session_key(rollout_id: str, harness_session_id: str | None) -> str:
    """The key a release routes a call by; empty: the call's own id (no session to keep it on)."""
    if rollout_id and rollout_id != UNATTRIBUTED:
        return rollout_id
    return f"session:{harness_session_id}" if harness_session_id else ""


class ReleaseRoutedUpstream:
    def __init__(self, inner: Upstream, follower: ReleaseFollower, ready_timeout_s: float = 30.0) -> None:
        self._inner = inner
        self.follower = follower
        self.ready_timeout_s = ready_timeout_s
        self._synced: Traffic | None = None
        self._sync_lock = asyncio.Lock()

    def __getattr__(self, name: str) -> Any:  # only called for what this class does not define
        if name == "_inner":  # not set yet (a half-built object): no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)

    @property
    def name(self) -> str:
        return self._inner.name

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self._inner.generate(await self._routed(request))

    def generate_stream(self, request: GenerateRequest) -> _RoutedStream:
        return _RoutedStream(lambda: self._routed(request), self._inner.generate_stream)

    def generate_chat_stream(self, request: ChatGenerateRequest) -> _RoutedStream:
        return _RoutedStream(lambda: self._routed(request), self._inner.generate_chat_stream)  # type: ignore[attr-defined]

    async def policy_version(self) -> int:
        return await self._inner.policy_version()

    async def close(self) -> None:
        await asyncio.to_thread(self.follower.close)
        await self._inner.close()

    def release_status(self) -> dict[str, Any]:
        """What /health shows: the plan followed and the versions the engine keeps."""
        status = self.follower.status()
        resident = getattr(self._inner, "resident_versions", None)
        if resident is not None:
            status["resident_versions"] = sorted(resident())
        return status

    # ------------------------------------------------------------------------------ routing
    async def version_for(self, session_key: str) -> int | None:
        """The version that serves ``session_key`` now; None while the track has no decision."""
        if not self.follower.caught_up.is_set():
            await asyncio.to_thread(self.follower.caught_up.wait, self.ready_timeout_s)
            if not self.follower.caught_up.is_set():
                raise UpstreamError(f"the release decisions on {self.follower.topic} are not read yet "
                                    f"({self.follower.status()['error'] or 'still reading'})", 503,
                                    "release_plan_unavailable")
        traffic = self.follower.traffic()
        if traffic is None:
            return None
        await self._keep_resident(traffic)
        return traffic.version_for(session_key)

    async def _routed(self, request: Request) -> Request:
        version = await self.version_for(request.session_key or request.rollout_id or request.request_id)
        return request if version is None else dataclasses.replace(request, policy_version=version)

    async def _keep_resident(self, traffic: Traffic) -> None:
        """Tell an engine that keeps several versions which ones the plan serves, once per plan change."""
        serve = getattr(self._inner, "serve_versions", None)
        if serve is None or traffic is self._synced:
            return
        async with self._sync_lock:
            if traffic is self._synced:
                return
            try:
                await serve(set(traffic.served_versions()))
            except UpstreamError as exc:  # its requests get the error; the others are served
                log.warning("release %s: %s", traffic.model, exc)
            self._synced = traffic


class _RoutedStream:
    """The inner upstream's stream for the routed request, made at the first item (routing may wait for
    the plan); a ``prefer_whole`` said before then reaches it, so a client that does not stream still
    costs one whole upstream answer, not a stream of per-token events."""

    def __init__(self, route: Callable[[], Awaitable[Any]], make: Callable[[Any], Any]) -> None:
        self._route, self._make = route, make
        self._prefer_whole = False
        self._items: Any = None

    def prefer_whole(self) -> None:
        self._prefer_whole = True

    def __aiter__(self) -> _RoutedStream:
        return self

    async def __anext__(self) -> TokenChunk | GenerateResult:
        if self._items is None:
            self._items = self._make(await self._route())
            prefer = getattr(self._items, "prefer_whole", None)
            if self._prefer_whole and prefer is not None:
                prefer()
        return await self._items.__anext__()

    async def aclose(self) -> None:
        close = getattr(self._items, "aclose", None)
        if close is not None:
            await close()
