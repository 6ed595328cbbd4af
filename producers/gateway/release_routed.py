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

Every routed call's result (the whole answer, or a stream's final result) carries its ``release``: the
release id, the decision it was routed by, and its arm (serving, candidate, or pinned with the pin's label),
so the record says which side of which release the call was on, and the controller and the report can leave
pinned (evaluation) traffic out of the comparison and check the arm against the decision log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from producers.gateway.attempts import UNATTRIBUTED
from producers.upstreams.base import (
    ChatGenerateRequest,
    GenerateRequest,
    GenerateResult,
    ReleaseAssignment,
    TokenChunk,
    Upstream,
    UpstreamError,
)
from producers.upstreams.deferred_stream import DeferredStream
from schemas.kafka.release_follower import ReleaseFollower
from schemas.release_traffic import Traffic

log = logging.getLogger(__name__)
Request = TypeVar("Request", GenerateRequest, ChatGenerateRequest)


def session_key(rollout_id: str, harness_session_id: str | None) -> str:
    """The key a release routes a call by; empty: the call's own id (no session to keep it on)."""
    if rollout_id and rollout_id != UNATTRIBUTED:
        return rollout_id
    return f"session:{harness_session_id}" if harness_session_id else ""


def assignment(traffic: Traffic, session_key: str, label: str | None = None) -> tuple[int, ReleaseAssignment]:
    """The version that serves ``session_key`` under ``traffic`` and the arm it is on. A pinned label wins
    whatever the ramp (and is pinned even where its version is serving's: evaluation traffic stays out of the
    comparison); otherwise the candidate's arm is the sessions its hash puts on the candidate."""
    version = traffic.version_for(session_key, label)
    decided = traffic.sequence - 1  # Traffic.sequence is the next decision's number
    if label is not None and label in traffic.pinned:
        return version, ReleaseAssignment(traffic.release_id, decided, "pinned", label)
    on_candidate = traffic.candidate_version is not None and version == traffic.candidate_version
    return version, ReleaseAssignment(traffic.release_id, decided, "candidate" if on_candidate else "serving")


def _labelled(result: Any, release: ReleaseAssignment | None) -> Any:
    if release is None or not isinstance(result, GenerateResult):
        return result
    return dataclasses.replace(result, release=release)


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
        routed, release = await self._routed(request)
        return _labelled(await self._inner.generate(routed), release)

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
        routed = await self.assignment_for(session_key)
        return None if routed is None else routed[0]

    async def assignment_for(self, session_key: str,
                             label: str | None = None) -> tuple[int, ReleaseAssignment] | None:
        """The version and release arm that serve ``session_key`` now; None while the track has no decision."""
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
        return assignment(traffic, session_key, label)

    async def _routed(self, request: Request) -> tuple[Request, ReleaseAssignment | None]:
        routed = await self.assignment_for(request.session_key or request.rollout_id or request.request_id,
                                           request.traffic_label)
        if routed is None:
            return request, None
        version, release = routed
        return dataclasses.replace(request, policy_version=version), release

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


class _RoutedStream(DeferredStream):
    """The inner upstream's stream for the routed request, made at the first item (routing may wait for
    the plan); a ``prefer_whole`` said before then reaches it, so a client that does not stream still
    costs one whole upstream answer, not a stream of per-token events. The final result gets the release
    assignment ``route`` gave."""

    def __init__(self, route: Callable[[], Awaitable[tuple[Any, ReleaseAssignment | None]]],
                 make: Callable[[Any], Any]) -> None:
        super().__init__()
        self._route, self._make = route, make
        self._assignment: ReleaseAssignment | None = None

    async def _open(self) -> Any:
        request, self._assignment = await self._route()
        return self._make(request)

    async def _settle(self, item: TokenChunk | GenerateResult) -> TokenChunk | GenerateResult:
        return _labelled(item, self._assignment)
