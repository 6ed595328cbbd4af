"""Several policy versions served at once on vLLM: one version per server (docs/release-vllm.md).

A vLLM server runs one set of weights. A release serves two or more versions at once (serving, candidate,
pinned ones), so this upstream gives each version the plan serves servers of its own: ``serve_versions``
(called by the release router, producers/gateway/release_routed.py, whenever the plan changes) assigns
the servers (``assign_servers``: a version keeps the servers that already hold it, a version with none
takes a free server or one from the version with the most, and the servers left over go to that biggest
version, which is the serving one since the fleet served it alone before the release), then loads each
moved server with the version's weights *before* it takes any of that version's calls: the server
leaves routing, its running calls finish, the loader (the weight sync's admin path, given by the shell:
trainer_consumer/weight_sync/syncer.py ``WeightSync.load_one``) pauses it, reloads the version from the
policy store, labels it and resumes it, and the label is read back before calls go there.

Each request goes to a server that holds its ``policy_version`` (rendezvous order of its session key
among those, so a session keeps its server and prefix cache). A request for a version no server holds
waits (``wait_s``) for one to be loaded, then fails with a 503 ``policy_version_unavailable`` in the
caller's protocol. A request naming no version (no release decision yet) goes to the servers the release
does not hold, which the trainer's weight sync keeps on its newest version (``held_servers`` tells the
sync which to leave alone), or to any server when the release holds them all.

Token generation uses vLLM's ``/inference/v1/generate`` (servers need ``--enable-scale-out``), so every
result's ``policy_version`` is the version vLLM reports for the tokens (``weight_versions``), never this
router's belief; a call whose report differs from the version it was routed for is counted in
``checks["mismatched"]`` and logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from producers.upstreams.base import ChatGenerateRequest, GenerateRequest, GenerateResult, TokenChunk, UpstreamError
from producers.upstreams.deferred_stream import DeferredStream
from producers.upstreams.vllm import VLLMUpstream, rendezvous_order
from producers.upstreams.vllm.client import settings_options

log = logging.getLogger(__name__)


class VersionLoader(Protocol):
    """Loads a policy version's weights into one server and reads back what a server serves."""

    async def load(self, server: str, version: int) -> None:
        """Pause (running requests finish), reload ``version`` from the policy store, reset the prefix cache,
        label the weights ``version``, resume; raises when the server could not be brought there."""

    async def version_of(self, server: str) -> int | None:
        """The version the server's weight label names (``GET /weight_info``); None for a foreign label."""

    def exclusive(self) -> AbstractAsyncContextManager[Any]:
        """Held while the release reads the servers' versions and takes servers: no other update (the trainer's
        sync) of any server is under way or starts meanwhile, so a server kept at its version stays there."""


class FleetSync(Protocol):
    """The trainer's weight sync (trainer_consumer/weight_sync ``WeightSync``): keeps the servers the release does
    not hold on the newest published version."""

    async def follow(self, stop: asyncio.Event, interval_s: float = 0.5) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Assignment:
    servers: dict[str, int]  # server -> the version it serves for the release
    unserved: frozenset[int]  # versions the plan serves that got no server (fewer servers than versions)


def assign_servers(servers: Sequence[str], holding: Mapping[str, int | None], versions: Collection[int]) -> Assignment:
    """Which server serves which version: every version at least one server, as few reloads as possible.

    Pure and deterministic. A version keeps the servers that hold it now; a version with none takes a free
    server (one holding no served version) or, when none is free, one from the version with the most servers
    (while it keeps at least one); free servers left over go to the version with the most servers (ties: the
    lower version), so the serving version keeps most of the fleet and a candidate gets its own."""
    wanted = sorted(set(versions))
    if not wanted:
        return Assignment({}, frozenset())
    kept: dict[int, list[str]] = {v: [s for s in servers if holding.get(s) == v] for v in wanted}
    free = [s for s in servers if holding.get(s) not in kept]
    unserved: set[int] = set()

    def biggest() -> int:
        return max(wanted, key=lambda v: (len(kept[v]), -v))

    for version in [v for v in wanted if not kept[v]]:
        if free:
            kept[version].append(free.pop(0))
            continue
        donor = biggest()
        if len(kept[donor]) > 1:
            kept[version].append(kept[donor].pop())
        else:
            unserved.add(version)
    main = biggest()
    kept[main].extend(free)
    return Assignment({s: v for v, held in kept.items() for s in held}, frozenset(unserved))


class VersionedVLLMUpstream:
    """Upstream over a vLLM fleet where each server serves one policy version and a release may hold several."""

    name = "vllm"

    def __init__(self, servers: Sequence[str] | str, loader: VersionLoader, *, wait_s: float = 30.0,
                 trainer_sync: FleetSync | None = None, follow_trainer: bool = True,
                 make_client: Callable[[str], Any] | None = None, **client_options: Any) -> None:
        if isinstance(servers, str):
            servers = [s for s in servers.split(",") if s.strip()]
        self.servers = [s.strip().rstrip("/") for s in servers]
        if not self.servers:
            raise ValueError("VersionedVLLMUpstream needs at least one server URL")
        self.loader = loader
        self.wait_s = wait_s
        # the trainer's weight sync of the same fleet, run by ``follow_policies`` (it asks ``held_servers``)
        # (closed with this upstream; ``follow_trainer`` False: only its admin path is used, by the loader)
        self.trainer_sync = trainer_sync
        self.follow_trainer = follow_trainer
        self._sync_stop: asyncio.Event | None = None
        self._sync_task: asyncio.Task[None] | None = None
        client_options["token_endpoint"] = "generate"  # vLLM's own report of each call's version
        # one single-server client per server (``make_client``: another client for a server, e.g. in tests)
        make = make_client or (lambda url: VLLMUpstream([url], **client_options))
        self._clients = {url: make(url) for url in self.servers}
        self._versions: dict[str, int | None] = {}  # what each server serves, as last read or loaded
        self._held: dict[str, int] = {}  # servers the release holds, routable, -> their version
        self._moving: dict[str, int] = {}  # servers the release holds that are being loaded -> version
        self._inflight: Counter[str] = Counter()
        self._changed = asyncio.Condition()  # any of the three maps above or the counts changed
        self._apply_lock = asyncio.Lock()  # one plan change at a time, in the order they came
        self._tasks: set[asyncio.Task[None]] = set()
        self.errors: list[str] = []  # loads that failed, for /health and the tests
        self.checks = {"checked": 0, "mismatched": 0}

    @classmethod
    def from_settings(cls, gateway: Any, loader: VersionLoader, **kwargs: Any) -> VersionedVLLMUpstream:
        """Servers from ``gateway.upstream`` (comma-separated base URLs), as ``VLLMUpstream.from_settings``."""
        return cls(gateway.upstream, loader, **{**settings_options(gateway), **kwargs})

    def __getattr__(self, name: str) -> Any:  # model(), engine(), max_model_len, logprob_kind: the fleet's
        if name == "_clients":
            raise AttributeError(name)
        return getattr(self._clients[self.servers[0]], name)

    # ------------------------------------------------------------------------------ the plan
    def held_servers(self) -> frozenset[str]:
        """Servers the release holds (serving or being loaded with a version it serves): the trainer's weight
        sync leaves them alone."""
        return frozenset(self._held) | frozenset(self._moving)

    def resident_versions(self) -> set[int]:
        """Versions some server serves for the release now (shown in /health's release section)."""
        return set(self._held.values())

    def fleet(self) -> dict[str, dict[str, Any]]:
        """Per server: the version it serves, and whether the release holds it or is loading it."""
        return {url: {"version": self._versions.get(url), "held": url in self._held, "loading": url in self._moving,
                      "inflight": self._inflight[url]} for url in self.servers}

    async def serve_versions(self, versions: set[int]) -> None:
        """Serve exactly ``versions`` from now on. Servers that keep their version are held at once; the moves
        run in the background (a request for a version being loaded waits for it), in the order plans came."""
        task = asyncio.get_running_loop().create_task(self._apply(frozenset(versions)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await asyncio.sleep(0)  # let it take the lock now, so plans apply in call order

    async def settled(self) -> None:
        """Wait until every plan given so far is applied (tests, and a clean close)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _apply(self, versions: frozenset[int]) -> None:
        async with self._apply_lock:
            async with self.loader.exclusive():
                await self._read_versions()
                assignment = assign_servers(self.servers, self._versions, versions)
                moves = {s: v for s, v in assignment.servers.items() if self._versions.get(s) != v}
                async with self._changed:
                    self._held = {s: v for s, v in assignment.servers.items() if s not in moves}
                    self._moving = dict(moves)
                    self._changed.notify_all()
            if assignment.unserved:
                self._error(f"no server left for version(s) {sorted(assignment.unserved)}: "
                            f"{len(self.servers)} servers for {len(versions)} versions")
            await asyncio.gather(*(self._move(server, version) for server, version in moves.items()))

    async def _read_versions(self) -> None:
        async def read(url: str) -> None:
            try:
                self._versions[url] = await self.loader.version_of(url)
            except Exception as exc:  # an unreachable server holds nothing we know of: no version keeps it
                self._versions[url] = None
                self._error(f"{url}: cannot read its version: {exc}")

        # every server: the trainer's sync may have moved those the release did not hold
        await asyncio.gather(*(read(url) for url in self.servers))

    async def _move(self, server: str, version: int) -> None:
        """Load ``version`` into ``server`` once its running calls are done, check vLLM's label, then route."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._inflight[server] == 0)
        try:
            await self.loader.load(server, version)
            reported = await self.loader.version_of(server)
        except Exception as exc:
            self._versions[server] = None  # unknown: read again before the next plan uses it
            self._error(f"loading version {version} into {server} failed: {exc}")
            reported = None
        async with self._changed:
            self._moving.pop(server, None)
            if reported == version:
                self._versions[server] = version
                self._clients[server].set_policy_version(version)  # paths without vLLM's report
                self._held[server] = version
            elif reported is not None:
                self._versions[server] = reported
                self._error(f"{server} reports version {reported} after loading {version}: not routed")
            self._changed.notify_all()

    def _error(self, message: str) -> None:
        log.warning("vLLM versions: %s", message)
        self.errors.append(message)

    # ------------------------------------------------------------------------------ routing
    def _candidates(self, version: int | None) -> list[str]:
        if version is not None:
            return [s for s in self.servers if self._held.get(s) == version]
        unheld = [s for s in self.servers if s not in self._held and s not in self._moving]
        return unheld or list(self._held)

    async def _take(self, request: GenerateRequest | ChatGenerateRequest) -> str:
        """A server for ``request`` with a slot taken on it (release with ``_done``); waits for one to hold the
        request's version for at most ``wait_s``."""
        version = request.policy_version
        key = request.session_key or request.rollout_id or request.request_id
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: bool(self._candidates(version))), self.wait_s)
            except TimeoutError:
                what = f"policy version {version}" if version is not None else "a policy version"
                raise UpstreamError(f"no vLLM server serves {what} (waited {self.wait_s:.0f} s; fleet: "
                                    f"{self.fleet()})", 503, "policy_version_unavailable") from None
            server = rendezvous_order(key, self._candidates(version))[0]
            self._inflight[server] += 1
            return server

    async def _done(self, server: str) -> None:
        async with self._changed:
            self._inflight[server] -= 1
            self._changed.notify_all()

    def _check(self, request: GenerateRequest | ChatGenerateRequest, result: GenerateResult) -> None:
        """vLLM's report is what the record keeps; count a disagreement with the routed version."""
        if request.policy_version is None:
            return
        self.checks["checked"] += 1
        if result.policy_version != request.policy_version:
            self.checks["mismatched"] += 1
            log.warning("call %s routed for version %d was sampled by version %d (vLLM's report)",
                        request.request_id, request.policy_version, result.policy_version)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        server = await self._take(request)
        try:
            result = await self._clients[server].generate(request)
        finally:
            await self._done(server)
        self._check(request, result)
        return result

    def generate_stream(self, request: GenerateRequest) -> _ServerStream:
        return _ServerStream(self, request, lambda server: self._clients[server].generate_stream(request))

    def generate_chat_stream(self, request: ChatGenerateRequest) -> _ServerStream:
        return _ServerStream(self, request, lambda server: self._clients[server].generate_chat_stream(request))

    async def chat_passthrough(self, *args: Any, **kwargs: Any) -> Any:
        raise UpstreamError("the upstream prefix mode does not route by policy version; use splice or retokenize "
                            "with several versions on vLLM", 501, "not_supported")

    chat_passthrough_stream = chat_passthrough

    async def policy_version(self) -> int:
        """The version a call naming none gets: what the servers outside the release serve (the newest known)."""
        known = [v for s, v in self._versions.items() if v is not None and s not in self._held]
        known = known or [v for v in self._versions.values() if v is not None]
        return max(known, default=0)

    def follow_policies(self, store: Any, interval_s: float = 0.5) -> None:
        """The gateway's start-up hook (create_app with ``policy_dir``): run the trainer's sync on this loop."""
        if self.trainer_sync is None or not self.follow_trainer or self._sync_task is not None:
            return
        self._sync_stop = asyncio.Event()
        self._sync_task = asyncio.get_running_loop().create_task(self.trainer_sync.follow(self._sync_stop, interval_s))

    async def close(self) -> None:
        if self._sync_task is not None and self._sync_stop is not None:
            self._sync_stop.set()
            await self._sync_task
        if self.trainer_sync is not None:
            await self.trainer_sync.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await asyncio.gather(*(client.close() for client in self._clients.values()))


class _ServerStream(DeferredStream):
    """The chosen server's stream, opened at the first item (choosing may wait for a version to load); the
    server's slot is held until the stream ends, fails or is closed, so a load never starts under it."""

    def __init__(self, owner: VersionedVLLMUpstream, request: GenerateRequest | ChatGenerateRequest,
                 make: Any) -> None:
        super().__init__()
        self._owner, self._request, self._make = owner, request, make
        self._server: str | None = None

    async def _open(self) -> AsyncIterator[TokenChunk | GenerateResult]:
        self._server = await self._owner._take(self._request)
        return self._make(self._server)

    async def _settle(self, item: TokenChunk | GenerateResult) -> TokenChunk | GenerateResult:
        if isinstance(item, GenerateResult):  # generation is over: the server may be reloaded now
            await self._release()
            self._owner._check(self._request, item)
        return item

    async def _release(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await self._owner._done(server)
