"""Weight sync: bring a fleet of vLLM servers to each policy version the trainer publishes.

Driven by the policy store (``models.policy_store``), the trainer's publication: ``follow`` reads its
``latest`` and, when it moves (or ``notify`` says it did), updates every server as a unit:

    before_update hook (a router stops sending calls and waits for its running ones)
    every server: POST /pause?mode=MODE      wait: running requests finish; keep: they are frozen in flight;
                                             new ones are held either way
                  POST /collective_rpc       {"method": "reload_weights", "kwargs": {"weights_path": DIR}}
                  POST /reset_prefix_cache   no KV computed by the old weights serves the new ones (keep:
                                             ?reset_running_requests=true, the frozen requests recompute)
                  POST /update_weight_version {"new_version": "N"}   GET /weight_info now says N
    after_update hook (with the new FleetView: the router records N and routes to current servers)
    every server: POST /resume

So no request is scheduled while weights change, and vLLM's own label matches its weights whenever it
samples: under ``keep`` a request running across the update has its tokens in two spans of vLLM's
``weight_versions`` (old, new), and the update does not wait for the longest running request.
A server whose update fails is resumed labelled ``incomplete-N`` (its weights may be
half-loaded), marked FAILED, reported, and left out of ``FleetView.routable``; every later tick
tries it again. Every tick also reads each server's label (GET /weight_info): a server that stopped
answering leaves routing, and one that restarted (label ``default``, the base weights) is brought
to the current version before it is routable again — within one tick of its restart.

Servers a release holds (``held``: a router that serves several versions at once, one per server,
producers/upstreams/vllm_versions.py) are the release's: the sync never pauses, reloads or relabels
them, and updates only the others. The release moves its servers with ``load_one``, the same admin
path under the same lock, so the two never update one server at once.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
import torch

from models.element_delta import DeltaMismatch, Mirror, apply_element_delta, cast_state
from models.policy_delta import load_element_delta, read_delta, read_element_delta, weight_group
from models.policy_store import PolicyStore, PolicyStoreError, load_weights_dir
from trainer_consumer.weight_sync.fleet import FleetView, ServerState, ServerStatus, initial_view, judge, parse_label
from trainer_consumer.weight_sync.vllm_admin import AdminError, PauseMode, VLLMAdmin
from trainer_consumer.weight_sync.vllm_scatter import PREPARE, RELOAD_CHECK, SCATTER

Transfer = Literal["scatter", "elements", "delta", "full"]
MIRRORS_KEPT = 2  # versions whose weights the sync keeps in memory, as the engines hold them (element deltas)


def checkpoint_bytes(weights_dir: Path) -> int:
    """What a full reload reads: every safetensors file of the directory (vLLM's loader reads them all)."""
    return sum(p.stat().st_size for p in weights_dir.glob("*.safetensors"))


class SyncHooks(Protocol):
    async def before_update(self, version: int, servers: Sequence[str]) -> None: ...

    async def after_update(self, view: FleetView) -> None: ...


class NoHooks:
    async def before_update(self, version: int, servers: Sequence[str]) -> None:
        return None

    async def after_update(self, view: FleetView) -> None:
        return None


@dataclass(frozen=True)
class SyncReport:
    version: int
    updated: list[str]
    failed: dict[str, str]  # server -> why
    paused_s: dict[str, float]  # server -> seconds it was paused
    total_s: float  # from the start of the update to the resume of the last server
    view: FleetView
    # server -> the version it reported before this update (0: base weights, as after a restart; None:
    # unknown or unreachable): the evidence that a restarted server was synced before it took calls
    previous: dict[str, int | None] = field(default_factory=dict)
    # server -> how its weights came: "scatter" (only the changed elements, written in place by the server's
    # workers), "elements" (only the changed elements, reconstructed here), "delta" (only
    # the changed groups), "full", or "full (why no delta)"
    loads: dict[str, str] = field(default_factory=dict)
    # server -> bytes read from the policy store for it: the checkpoint, the group delta, or the element delta
    bytes_moved: dict[str, int] = field(default_factory=dict)
    # server -> bytes its loader read from the sync's reconstruction of the changed groups ("elements" only)
    bytes_reloaded: dict[str, int] = field(default_factory=dict)
    # server -> what each of its workers answered to a scatter ("scatter" only: elements and tensors written,
    # layers repacked, the bytes the worker read, seconds)
    scattered: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass
class _Step:
    """What happened to one server in one update."""

    url: str
    state: ServerState
    paused_s: float = 0.0
    load: str = ""
    bytes_moved: int = 0
    bytes_reloaded: int = 0
    scattered: list[Any] = field(default_factory=list)
    resumed: bool = False
    error: str = ""
    admin_errors: list[str] = field(default_factory=list)


class WeightSync:
    def __init__(self, servers: Sequence[str], store: PolicyStore, *, pause_mode: PauseMode = "wait",
                 timeout_s: float = 120.0, hooks: SyncHooks | None = None,
                 log: Callable[[str], None] | None = None, initial_target: int = 0,
                 base_dir: Path | None = None, client: httpx.AsyncClient | None = None,
                 held: Callable[[], Collection[str]] | None = None, transfer: Transfer = "delta",
                 engine_dtype: torch.dtype = torch.float32) -> None:
        if not servers:
            raise ValueError("weight sync needs at least one vLLM server")
        self.store = store
        self.base_dir = base_dir  # the model the servers start with: version 0 unless the store has one
        self.pause_mode: PauseMode = pause_mode
        # "delta": load only what changed when a version was published with a delta against the version a
        # server holds (else, or on any error, the full checkpoint); "full": always the full checkpoint;
        # "elements": only the elements that changed (models/element_delta.py), applied to the sync's in-memory
        # copy of the weights the server holds (in ``engine_dtype``), checked against the published checksums and
        # loaded as the changed groups; any mismatch: the full checkpoint; "scatter": only the changed elements,
        # read by the server's workers and written into their parameters in place (the server runs the worker
        # extension ``vllm_scatter.ScatterExtension``); when it cannot be tried, what "delta" does; when the workers
        # refuse it, the full checkpoint
        self.transfer: Transfer = transfer
        self.engine_dtype = engine_dtype
        self._mirrors: dict[int, tuple[Mirror, tuple[str, ...]]] = {}  # version -> weights, names changed
        # server -> the version its workers' scatter copy holds (prepared after a full load, moved by scatters)
        self._scatter_ready: dict[str, int] = {}
        self._cannot_scatter: set[str] = set()  # servers whose workers refused to prepare (logged once)
        self._reload_refusals: dict[str, str] = {}  # per server: why it cannot be reloaded in place ("" it can)
        self.hooks: SyncHooks = hooks or NoHooks()
        self._log = log or (lambda line: None)
        self._client = client or httpx.AsyncClient()
        self._admins = {url.rstrip("/"): VLLMAdmin(url, self._client, timeout_s) for url in servers}
        self.view = initial_view(self._admins, initial_target)
        self.reports: list[SyncReport] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # one update at a time
        # servers a release holds at a version of its own (asked at every update): left alone
        self._held = held or (lambda: ())

    async def close(self) -> None:
        await self._client.aclose()

    def notify(self) -> None:
        """The trainer published: look at the store now rather than at the next tick."""
        self._wake.set()

    async def check(self) -> FleetView:
        """Ask every server for its label (GET /weight_info) and judge it against the target."""
        async def one(url: str, admin: VLLMAdmin) -> ServerState:
            previous = self.view.servers[url]
            try:
                version = parse_label(await admin.weight_label())
            except AdminError as exc:
                return ServerState(url, previous.version, ServerStatus.UNREACHABLE, str(exc))
            if previous.status is ServerStatus.FAILED and version != self.view.target:
                return ServerState(url, version, ServerStatus.FAILED, previous.error)
            return judge(url, version, self.view.target)

        states = await asyncio.gather(*(one(url, admin) for url, admin in self._admins.items()))
        self.view = FleetView(self.view.target, {s.url: s for s in states})
        return self.view

    async def sync_to(self, version: int, servers: Sequence[str] | None = None) -> SyncReport:
        """Update ``servers`` (default: all) to ``version`` together; returns what happened to each."""
        async with self._lock:
            weights_dir = str(self.weights_dir(version))
            held = set(self._held())
            urls = [url for url in (list(servers) if servers is not None else list(self._admins)) if url not in held]
            began = time.monotonic()
            await self.hooks.before_update(version, urls)
            steps = {url: _Step(url, self.view.servers[url]) for url in urls}
            previous = {url: step.state.version for url, step in steps.items()}
            try:
                await asyncio.gather(*(self._pause_and_load(steps[url], version, weights_dir) for url in urls))
                view = self.view.retarget(version)
                for step in steps.values():
                    view = view.with_server(step.state)
                self.view = view
                await self.hooks.after_update(view)
            finally:
                await asyncio.gather(*(self._resume(step) for step in steps.values()))
            report = SyncReport(version, [u for u, s in steps.items() if not s.error],
                                {u: s.error for u, s in steps.items() if s.error},
                                {u: s.paused_s for u, s in steps.items()}, time.monotonic() - began, self.view,
                                previous, {u: s.load for u, s in steps.items()},
                                {u: s.bytes_moved for u, s in steps.items()},
                                {u: s.bytes_reloaded for u, s in steps.items() if s.load == "elements"},
                                {u: s.scattered for u, s in steps.items() if s.load == "scatter"})
            self.reports.append(report)
            # how each server's weights came (scatter / delta / elements / full): the evidence that the transfer
            # the settings name is the one that carries the updates
            loads = ", ".join(sorted({load for load in report.loads.values() if load}))
            self._log(f"weight sync to version {version}: {len(report.updated)}/{len(urls)} servers in "
                      f"{report.total_s:.2f} s" + (f"; loads: {loads}" if loads else "")
                      + (f"; FAILED {report.failed}" if report.failed else ""))
            return report

    async def load_one(self, url: str, version: int) -> ServerState:
        """Bring one server to ``version`` (pause, reload, reset the prefix cache, label, resume) without
        moving the fleet's target: a release loading the version it serves there. No hooks run (the caller
        routes around the server); returns the server's state, FAILED with the reason when it failed."""
        async with self._lock:
            weights_dir = str(self.weights_dir(version))
            step = _Step(url, self.view.servers[url])
            try:
                await self._pause_and_load(step, version, weights_dir)
            finally:
                await self._resume(step)
            state = step.state if step.error else judge(url, version, self.view.target)
            self.view = self.view.with_server(state)
            self._log(f"weight sync: {url} loaded version {version}" if not step.error else
                      f"weight sync: loading version {version} into {url} FAILED: {step.error}")
            return state

    def exclusive(self) -> asyncio.Lock:
        """The lock every update takes. A release holds it while it reads the servers' versions and decides
        which it takes, so no update of a server is under way or starts while it does."""
        return self._lock

    async def version_of(self, url: str) -> int | None:
        """The version ``url``'s label names (GET /weight_info); None for a foreign label."""
        return parse_label(await self._admins[url].weight_label())

    def weights_dir(self, version: int) -> Path:
        """Where ``version``'s weights are; raises PolicyStoreError when it is not published."""
        if version == 0 and self.base_dir is not None and 0 not in self.store.versions():
            return self.base_dir
        return self.store.info(version).path

    async def _pause_and_load(self, step: _Step, version: int, weights_dir: str) -> None:
        admin = self._admins[step.url]
        refusal = await self._reload_refusal(step.url, admin)
        if refusal:  # keep the weights it serves, correctly labelled, rather than load wrong ones
            step.resumed, step.error = True, refusal
            step.state = ServerState(step.url, step.state.version, ServerStatus.FAILED, refusal)
            return
        step.paused_s = time.monotonic()
        try:
            await admin.pause(self.pause_mode)
        except AdminError as exc:
            step.resumed, step.paused_s = True, 0.0  # never paused: nothing to resume
            step.error = str(exc)
            step.state = ServerState(step.url, step.state.version, ServerStatus.UNREACHABLE, str(exc))
            return
        try:
            await self._load(step, admin, version, weights_dir)
            in_flight = self.pause_mode == "keep"
            if not await admin.reset_prefix_cache(preempt_running=in_flight) and in_flight:
                raise AdminError(step.url, "/reset_prefix_cache", "the KV cache of the old weights was not reset")
            await admin.set_weight_label(str(version))
        except AdminError as exc:
            step.error = str(exc)
            step.state = ServerState(step.url, None, ServerStatus.FAILED, str(exc))
            try:  # the label must not claim the old version over weights that may be half-loaded
                await admin.set_weight_label(f"incomplete-{version}")
            except AdminError as label_exc:
                step.admin_errors.append(str(label_exc))
            return
        step.state = ServerState(step.url, version, ServerStatus.CURRENT)

    async def _load(self, step: _Step, admin: VLLMAdmin, version: int, weights_dir: str) -> None:
        """Load ``version`` into the server: by its element delta (``scatter``, ``elements``) or its group delta
        (``delta``; also ``scatter`` when the scatter was not tried: no element delta, a server without the
        extension) when one applies to what the server holds, else (or when that load fails) the full
        checkpoint."""
        if self.transfer == "scatter":
            why, tried = await self._load_scatter(step, admin, version)
            if not why:
                return
            if tried:  # the workers may have written part of it: only a full load puts every weight right
                self._log(f"weight sync: {step.url} version {version}: {why}; loading the full checkpoint")
            else:  # nothing was written: the group delta may still apply, as under "delta"
                why = self._delta_refused(step.state.version, version) or await self._load_delta(
                    step, admin, version, weights_dir)
                if not why:
                    await self._prepare_scatter(step, admin, version, weights_dir)
                    return
        elif self.transfer == "elements":
            why = await self._load_elements(step, admin, version)
            if not why:
                return
            self._log(f"weight sync: {step.url} version {version}: {why}; loading the full checkpoint")
        else:
            why = self._delta_refused(step.state.version, version)
            if not why and self.transfer == "delta":
                why = await self._load_delta(step, admin, version, weights_dir)
                if not why:
                    return
        await admin.reload_weights(weights_dir)
        step.load = "full" + (f" ({why})" if self.transfer != "full" else "")
        step.bytes_moved = checkpoint_bytes(Path(weights_dir))
        if self.transfer == "scatter":
            await self._prepare_scatter(step, admin, version, weights_dir)
        if self.transfer == "elements" and version not in self._mirrors:
            # the base of the next element delta: the weights just loaded, as the engine holds them
            try:
                state = await asyncio.to_thread(load_weights_dir, Path(weights_dir))
                self._remember(version, await asyncio.to_thread(Mirror.of, cast_state(state, self.engine_dtype)), ())
            except (OSError, PolicyStoreError, ValueError) as exc:
                self._log(f"weight sync: no copy of version {version} for element deltas: {exc}")

    async def _load_delta(self, step: _Step, admin: VLLMAdmin, version: int, weights_dir: str) -> str:
        """Load the version's group delta (the changed groups, whole); returns why not ("" when it did)."""
        delta = read_delta(Path(weights_dir))
        assert delta is not None
        try:
            await admin.reload_weights(str(delta.path))
        except AdminError as exc:  # the full load puts every weight right
            why = f"delta load failed: {exc}"
            self._log(f"weight sync: {step.url} version {version}: {why}; loading the full checkpoint")
            return why
        step.load, step.bytes_moved = "delta", delta.delta_bytes
        return ""

    async def _load_elements(self, step: _Step, admin: VLLMAdmin, version: int) -> str:
        """Bring the server to ``version`` by its element delta; returns why not ("" when it did). The delta is
        applied to the sync's copy of the weights the server holds (no checkpoint is read), every tensor and the
        whole state must match the published checksums, and the server's loader reads the changed groups
        whole (vLLM fuses a layer's projections) from a temporary directory."""
        held = step.state.version
        info = read_element_delta(self.store.path(version)) if version in self.store.versions() else None
        if info is None:
            return "published without an element delta"
        if held != info.base_version:
            return f"server holds version {held}, the delta is against {info.base_version}"
        served = str(self.engine_dtype).removeprefix("torch.")
        if info.dtype != served:
            return f"the element delta is in {info.dtype}, the engine serves {served}"
        if version not in self._mirrors:
            if info.base_version not in self._mirrors:
                return f"no copy of version {info.base_version}'s weights to apply the element delta to"
            base = self._mirrors[info.base_version][0]
            try:
                delta = await asyncio.to_thread(load_element_delta, self.store.path(version))
                mirror, names = await asyncio.to_thread(apply_element_delta, base, delta)
            except DeltaMismatch as exc:
                return f"element delta mismatch: {exc}"
            self._remember(version, mirror, names)
        mirror, names = self._mirrors[version]
        groups = {weight_group(name) for name in names}
        moved = {name: t for name, t in mirror.tensors.items() if weight_group(name) in groups}
        staging = Path(tempfile.mkdtemp(prefix=f".elements-{version}-", dir=self.store.root))
        try:
            from safetensors.torch import save_file

            if moved:  # nothing changed: nothing to load, only the label moves
                await asyncio.to_thread(save_file, moved, str(staging / "model.safetensors"))
                await admin.reload_weights(str(staging))
        except AdminError as exc:  # the full load puts every weight right
            return f"element delta load failed: {exc}"
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        step.load, step.bytes_moved = "elements", info.nbytes
        step.bytes_reloaded = sum(t.numel() * t.element_size() for t in moved.values())
        return ""

    async def _load_scatter(self, step: _Step, admin: VLLMAdmin, version: int) -> tuple[str, bool]:
        """Bring the server to ``version`` by scattering its element delta in place (``vllm_scatter``); returns
        why not ("" when it did) and whether the workers were asked (then they may have written part of it).
        Nothing crosses but the delta file, which the workers read and check."""
        held = step.state.version
        info = read_element_delta(self.store.path(version)) if version in self.store.versions() else None
        if info is None:
            return "published without an element delta", False
        if held != info.base_version:
            return f"server holds version {held}, the delta is against {info.base_version}", False
        served = str(self.engine_dtype).removeprefix("torch.")
        if info.dtype != served:
            return f"the element delta is in {info.dtype}, the engine serves {served}", False
        ready = self._scatter_ready.get(step.url)
        if ready != held:
            return f"the server's workers hold no scatter copy of version {held} (theirs: {ready})", False
        try:
            step.scattered = await admin.worker_call(SCATTER, version_dir=str(self.store.path(version)))
        except AdminError as exc:  # the full load puts every weight right (and prepares again)
            self._scatter_ready.pop(step.url, None)
            return f"scatter failed: {exc}", True
        self._scatter_ready[step.url] = version
        step.load, step.bytes_moved = "scatter", info.nbytes
        return "", True

    async def _reload_refusal(self, url: str, admin: VLLMAdmin) -> str:
        """Why ``url`` cannot take a version in place ("" when it can), asked of its workers once (the extension's
        ``tokentrail_reload_check``). A server without the extension is taken as able: nothing says otherwise."""
        if url not in self._reload_refusals:
            try:
                answers = await admin.worker_call(RELOAD_CHECK)
            except AdminError as exc:
                if exc.status is None:  # not answered (down, restarting): ask again next time
                    return ""
                answers = []  # answered, without the method
            refusals = [str(a.get("reason") or "in-place reload refused") for a in answers
                        if isinstance(a, dict) and a.get("in_place") is False]
            self._reload_refusals[url] = refusals[0] if refusals else ""
            if refusals:
                self._log(f"weight sync: {url} is not updated in place: {refusals[0]}")
        return self._reload_refusals[url]

    async def _prepare_scatter(self, step: _Step, admin: VLLMAdmin, version: int, weights_dir: str) -> None:
        """After a load other than a scatter: the workers read the checkpoint and keep what the next scatter needs
        (on a CPU build a copy of the packed weights). Skipped when the store shows no sign of element deltas (the
        version has none and an earlier one exists: the trainer publishes without them), since preparing reads
        the whole checkpoint. A server without the extension (or a model it cannot map) goes on with group
        deltas and full loads; its weights are right either way."""
        self._scatter_ready.pop(step.url, None)
        in_store = version in self.store.versions()
        if in_store and read_element_delta(self.store.path(version)) is None and min(self.store.versions()) < version:
            return
        try:
            await admin.worker_call(PREPARE, weights_path=weights_dir)
        except AdminError as exc:
            if step.url not in self._cannot_scatter:
                self._cannot_scatter.add(step.url)
                self._log(f"weight sync: {step.url} cannot scatter element deltas (group deltas and full loads go "
                          f"on): {exc}")
            return
        self._cannot_scatter.discard(step.url)
        self._scatter_ready[step.url] = version

    def _remember(self, version: int, mirror: Mirror, names: tuple[str, ...]) -> None:
        self._mirrors[version] = (mirror, names)
        for old in sorted(self._mirrors)[:-MIRRORS_KEPT]:
            del self._mirrors[old]

    def _delta_refused(self, held: int | None, version: int) -> str:
        """Why a server holding ``held`` cannot reach ``version`` by its delta ("" when it can)."""
        if self.transfer not in ("delta", "scatter"):
            return "full transfer"
        if version == 0 or version not in self.store.versions():
            return "no delta for this version"
        delta = read_delta(self.store.path(version))
        if delta is None:
            return "published without a delta"
        if held != delta.base_version:
            return f"server holds version {held}, the delta is against {delta.base_version}"
        try:
            base_sha = self.store.info(delta.base_version).sha256
        except PolicyStoreError:
            return f"base version {delta.base_version} is no longer in the store"
        if not delta.applies_to(held, base_sha):
            return "delta checksum mismatch"
        return ""

    async def _resume(self, step: _Step) -> None:
        if step.resumed:
            return
        try:
            await self._admins[step.url].resume()
        except AdminError as exc:
            step.admin_errors.append(str(exc))
            if not step.error:
                step.error = str(exc)
                step.state = ServerState(step.url, step.state.version, ServerStatus.UNREACHABLE, str(exc))
                self.view = self.view.with_server(step.state)
        step.paused_s = time.monotonic() - step.paused_s
        step.resumed = True

    async def tick(self) -> SyncReport | None:
        """One look at the store and the fleet: sync to a newer published version; otherwise ask every
        server its label, so one that died leaves routing and one that restarted (on the base weights)
        or failed before is brought to the current version before it takes calls again."""
        latest = self.store.latest_version()
        if latest is not None and latest != self.view.target:
            return await self.sync_to(latest)
        routable_before = self.view.routable()
        view = await self.check()
        held = set(self._held())
        reachable_behind = [u for u in view.behind()
                            if view.servers[u].status is not ServerStatus.UNREACHABLE and u not in held]
        if reachable_behind:
            return await self.sync_to(view.target, reachable_behind)
        if view.routable() != routable_before:  # at start, or a server went away: tell the router
            await self.hooks.after_update(view)
        return None

    async def follow(self, stop: asyncio.Event, interval_s: float = 0.5) -> None:
        """Tick until ``stop`` is set; a failing tick is logged and retried."""
        while not stop.is_set():
            try:
                await self.tick()
            except Exception as exc:  # a server or the store misbehaving must not stop the sync
                self._log(f"weight sync tick failed: {type(exc).__name__}: {exc}")
            self._wake.clear()
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            await asyncio.wait(waits, timeout=interval_s, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waits:
                waiter.cancel()
