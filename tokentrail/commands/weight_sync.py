"""``tokentrail weight-sync``: keep a vLLM fleet on the trainer's latest published policy version.

Also the shell's in-process composition of the weight sync with the gateway's vLLM upstream
(``gate_upstream``): the gateway's calls take leases from a ``VersionGate`` that the sync closes around
each update, so every call records the version that sampled it and only current servers take calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.policy_store import PolicyStore
from producers.upstreams.base import ChatGenerateRequest, GenerateRequest, GenerateResult, TokenChunk
from producers.upstreams.vllm import VLLMUpstream, label_version, spans_from_text
from trainer_consumer.weight_sync import FleetView, VersionGate, WeightSync

if TYPE_CHECKING:
    from tokentrail.settings import Settings

_log = logging.getLogger("tokentrail.weight_sync")


class GatedUpstream:
    """``VLLMUpstream`` whose token generations hold a lease of ``gate`` from their first item to their
    end; the result's ``policy_version`` is the leased one. (Chat pass-through is not gated.)

    When vLLM reports which weights sampled the tokens (``token_endpoint="generate"``: per-token
    ``weight_versions`` spans), that report is the call's version and the lease is the check: the
    leased version goes into the result's ``extra["gate_version"]`` beside the spans, and a call where
    the two disagree is counted in ``checks["mismatched"]`` and logged. Under the gate they cannot
    disagree (no call runs while weights change); the count says so on real traffic.

    With ``sync``, the gateway's ``policy_dir`` start-up hook (``follow_policies``) runs the sync on the
    gateway's event loop, where the gate lives; ``close`` stops it."""

    def __init__(self, inner: VLLMUpstream, gate: VersionGate, sync: WeightSync | None = None,
                 interval_s: float = 0.5) -> None:
        self.inner = inner
        self.gate = gate
        self.sync = sync
        self.interval_s = interval_s
        self._stop: asyncio.Event | None = None
        self._follower: asyncio.Task[None] | None = None
        # calls whose version vLLM reported and that were compared with their lease; those that disagreed;
        # those whose tokens span more than one version (impossible under pause mode "wait")
        self.checks = {"checked": 0, "mismatched": 0, "spanning": 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def follow_policies(self, store: PolicyStore, interval_s: float | None = None) -> None:
        if self.sync is None or self._follower is not None:
            return
        if store.root != self.sync.store.root:
            raise ValueError(f"the weight sync follows {self.sync.store.root}, the gateway was given {store.root}")
        self._stop = asyncio.Event()
        self._follower = asyncio.get_running_loop().create_task(
            self.sync.follow(self._stop, interval_s or self.interval_s))

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        async with self.gate.lease() as version:
            result = await self.inner.generate(request)
        self.settle_version(result, version)
        return result

    def settle_version(self, result: GenerateResult, leased: int) -> None:
        """The version ``result`` records: vLLM's own report where it gave one (checked against the lease),
        else the leased one."""
        reported = result.extra.get("weight_versions")
        if not isinstance(reported, str):
            result.policy_version = leased
            return
        result.extra["gate_version"] = leased
        spans = spans_from_text(reported)
        self.checks["checked"] += 1
        if len({s.version for s in spans}) > 1:
            self.checks["spanning"] += 1
        if spans and label_version(spans[0].version) is None:  # a foreign label names no policy version
            result.policy_version = leased
        if any(label_version(s.version) != leased for s in spans):
            self.checks["mismatched"] += 1
            _log.warning("call %s: vLLM sampled it with weights %s, the gate leased version %d",
                         result.extra.get("vllm_id"), reported, leased)

    def generate_stream(self, request: GenerateRequest) -> _LeasedStream:
        return _LeasedStream(self.inner.generate_stream(request), self.gate, self)

    def generate_chat_stream(self, request: ChatGenerateRequest) -> _LeasedStream:
        return _LeasedStream(self.inner.generate_chat_stream(request), self.gate, self)

    async def policy_version(self) -> int:
        return self.gate.version

    async def close(self) -> None:
        if self._follower is not None and self._stop is not None:
            self._stop.set()
            await self._follower
            self._follower = None
        if self.sync is not None:
            await self.sync.close()
        await self.inner.close()


class _LeasedStream:
    def __init__(self, inner: Any, gate: VersionGate, owner: GatedUpstream) -> None:
        self._inner = inner
        self._gate = gate
        self._owner = owner
        self._lease: contextlib.AbstractAsyncContextManager[int] | None = None
        self._version = gate.version

    def prefer_whole(self) -> None:
        prefer = getattr(self._inner, "prefer_whole", None)
        if prefer is not None:
            prefer()

    def __aiter__(self) -> _LeasedStream:
        return self

    async def __anext__(self) -> TokenChunk | GenerateResult:
        if self._lease is None:
            lease = self._gate.lease()
            self._version = await lease.__aenter__()  # may wait while an update runs
            self._lease = lease  # only a lease actually taken is released
        try:
            item: TokenChunk | GenerateResult = await self._inner.__anext__()
        except BaseException:
            await self._release()
            raise
        if isinstance(item, GenerateResult):
            self._owner.settle_version(item, self._version)
        return item

    async def aclose(self) -> None:
        try:
            close = getattr(self._inner, "aclose", None)
            if close is not None:
                await close()
        finally:
            await self._release()

    async def _release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.__aexit__(None, None, None)


class GateHooks:
    """The sync's hooks for a gateway in this process: before an update that touches a server taking
    calls, close the gate (running calls finish, new ones wait); after it, route only to the servers
    at the new version and reopen the gate there (calls sent now are held by the paused servers and
    sampled by the new weights). With no current server the gate stays closed: calls wait rather
    than be served by an old policy."""

    def __init__(self, gate: VersionGate, upstream: VLLMUpstream) -> None:
        self.gate = gate
        self.upstream = upstream
        self.all_servers = list(upstream.servers)

    async def before_update(self, version: int, servers: Sequence[str]) -> None:
        if set(servers) & set(self.upstream.servers):
            await self.gate.close()

    async def after_update(self, view: FleetView) -> None:
        routable = [s for s in self.all_servers if s in set(view.routable())]
        if routable:
            self.upstream.servers = routable  # VLLMUpstream routes by this list (rendezvous order)
            self.upstream.set_policy_version(view.target)
            await self.gate.reopen(view.target)


def gate_upstream(upstream: VLLMUpstream, store: PolicyStore, *, base_dir: Path | None = None,
                  interval_s: float = 0.5, **sync_options: Any) -> GatedUpstream:
    """The gateway's upstream gated by a weight sync of the same servers (``.sync``), which the gateway
    runs when it is created with ``policy_dir`` = the store's root."""
    gate = VersionGate(0, is_open=False)  # until the first look at the fleet says what it serves
    sync = WeightSync(upstream.servers, store, hooks=GateHooks(gate, upstream), base_dir=base_dir,
                      **sync_options)
    return GatedUpstream(upstream, gate, sync, interval_s)


def gateway_upstream(settings: Settings) -> Any:
    """``tokentrail gateway``'s vLLM upstream when ``weight_sync.in_gateway`` is on: the settings' vLLM
    fleet, gated by a weight sync that follows ``trainer.checkpoint_dir``; with ``weight_sync.release_servers``
    the fleet serves each version a release serves on servers of its own, and the sync keeps the others on
    the newest version (tokentrail/commands/vllm_versions.py)."""
    section = settings.weight_sync
    if section.release_servers:
        from tokentrail.commands.vllm_versions import release_servers_upstream

        return release_servers_upstream(settings, follow_trainer=True)
    upstream = VLLMUpstream.from_settings(settings.gateway,
                                          token_endpoint="generate" if section.engine_versions else "completions")
    return gate_upstream(upstream, PolicyStore(settings.trainer.checkpoint_dir), base_dir=settings.model.dir,
                         interval_s=section.interval_s, pause_mode=section.pause_mode, timeout_s=section.timeout_s,
                         log=logging.getLogger("tokentrail.weight_sync").info)


# ---------------------------------------------------------------------------------------- the command

def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "weight-sync", help="keep vLLM servers on the trainer's latest published policy version",
        description="Follow the policy store (trainer.checkpoint_dir) and bring every vLLM server to each "
                    "newly published version as a unit: pause (wait), reload_weights via collective_rpc, "
                    "reset the prefix cache, label the version (GET /weight_info), resume. Servers must run "
                    "with VLLM_SERVER_DEV_MODE=1. Prints one line per update and per failing server.")
    p.add_argument("--servers", default=None,
                   help="comma-separated vLLM base URLs (default: settings weight_sync.servers, else "
                        "gateway.upstream)")
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="policy store (default: settings trainer.checkpoint_dir)")
    p.add_argument("--base-dir", type=Path, default=None,
                   help="the model the servers start from, served as version 0 (default: settings model.dir)")
    p.add_argument("--interval", type=float, default=None, metavar="S",
                   help="seconds between looks at the store (default: settings weight_sync.interval_s)")
    p.add_argument("--once", action="store_true", help="one look: sync if needed, print the fleet, exit")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from tokentrail.cli import CliError
    from tokentrail.settings import get_settings

    settings = get_settings()
    section = settings.weight_sync
    servers = [s for s in (args.servers or section.servers or settings.gateway.upstream).split(",") if s.strip()]
    if not servers or not all(s.startswith("http") for s in servers):
        raise CliError(f"no vLLM server URLs to sync ({servers}); pass --servers http://HOST:PORT,...")
    store = PolicyStore(args.checkpoint_dir or settings.trainer.checkpoint_dir)
    interval = args.interval if args.interval is not None else section.interval_s
    return asyncio.run(_follow(servers, store, args.base_dir or settings.model.dir, interval, args.once,
                               section.pause_mode, section.timeout_s))


async def _follow(servers: list[str], store: PolicyStore, base_dir: Path, interval_s: float, once: bool,
                  pause_mode: Any, timeout_s: float) -> int:
    began = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - began:7.1f} s] {line}", flush=True)

    sync = WeightSync(servers, store, pause_mode=pause_mode, timeout_s=timeout_s, log=log, base_dir=base_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        view = await sync.check()
        log(f"fleet: {_describe(view)}; store latest: {store.latest_version()}")
        if once:
            await sync.tick()
            log(f"fleet: {_describe(sync.view)}")
            return 0 if not sync.view.behind() else 1
        await sync.follow(stop, interval_s)
        return 0
    finally:
        await sync.close()


def _describe(view: FleetView) -> str:
    return ", ".join(f"{url} v{s.version} {s.status.value}" for url, s in view.servers.items())


