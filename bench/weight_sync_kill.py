"""A vLLM server killed mid-run: two servers behind the gated vLLM upstream, one killed with SIGKILL while
calls run and versions are published, then restarted on the same port.

The scenario itself (``run_kill_scenario``) is shared with the CI test
``tests/producers/upstreams/vllm_live/test_server_kill_live.py``, which drives it with calls through the
real gateway and checks the call records; this bench drives it with calls straight to the gated upstream.

What the bench checks, call by call (not assumed):
* routing around the dead server: ``failed_requests`` counts every call a client saw fail; a call
  lost with its server before anything reached the caller is retried on the other server, one that
  had already passed tokens on fails with a 502 ``upstream_unavailable`` (counted, with its message);
* the restarted server (vLLM labels its weights ``default``: the base model) is brought to the current
  version before it takes calls: ``restarted_calls_at_base`` counts calls it served with the base
  weights after it came back (must be 0), ``rejoin_version_behind`` whether the version it re-entered
  routing at was behind the fleet's target;
* no call recorded with a wrong version: every call goes through ``/inference/v1/generate``, whose
  answer says which weights sampled every token; ``version_mismatches`` counts calls whose recorded
  version differs from that report or from the gate's lease.

    python -m bench.weight_sync_kill [--updates 10] [--kill-after 3] [--server URL]

Both servers run with VLLM_SERVER_DEV_MODE=1 and --enable-scale-out. ``--server``: a running one to use
as the first server (the second is always started here, as it is the one killed). Last line: one JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from bench.common import emit
from bench.processes import free_port
from bench.weight_sync import PROMPT, final_result, perturbed, start_server, stop_server
from models.policy_store import PolicyStore
from producers.upstreams.base import GenerateRequest, Sampling
from producers.upstreams.vllm import VLLMUpstream, label_version, spans_from_text
from producers.upstreams.weight_gate import GatedUpstream
from tokentrail.runtime.weight_sync import gate_upstream
from trainer_consumer.weight_sync import ServerState, SyncReport

SCALE_OUT = ("--enable-scale-out",)


# ------------------------------------------------------------------------------------ the shared scenario

@dataclass
class Victim:
    """The server the scenario kills and restarts on the same port (same URL, so the fleet knows it)."""

    url: str
    kill: Callable[[], None]  # SIGKILL its process group and reap it: its connections break at once
    restart: Callable[[], None]  # start it again on its port; returns once its /health answers


@dataclass(frozen=True)
class RoutingChange:
    at: float  # time.time(), comparable with a call record's timings.received_at_us
    servers: tuple[str, ...]  # the upstream's routing list
    gate_version: int
    victim: ServerState  # the sync's view of the victim at that moment


@dataclass
class KillTimeline:
    """What the scenario did and when. Wall-clock times (time.time()) so that the test can order call
    records (``timings.received_at_us``) against them."""

    killed_at: float = 0.0
    left_routing_at: float = 0.0  # the sync took the dead server out of the upstream's routing list
    restart_began_at: float = 0.0  # until then nothing listened on the victim's port
    restart_healthy_at: float = 0.0  # the restart returned (its /health answered, up to a poll earlier)
    versions_while_down: list[int] = field(default_factory=list)
    last_version: int = 0
    routing: list[RoutingChange] = field(default_factory=list)
    # the sync's reports from the kill on: the failed updates of the dead server, its rejoin, the rest
    reports_after_kill: list[SyncReport] = field(default_factory=list)

    def rejoin(self) -> RoutingChange:
        """The first routing change after the victim left routing that has it back."""
        url = self.routing[0].victim.url
        return next(r for r in self.routing if r.at >= self.left_routing_at and url in r.servers)

    def rejoin_report(self) -> SyncReport:
        """The sync's first update of the victim after the kill: the one that brought it back."""
        url = self.routing[0].victim.url
        return next(r for r in self.reports_after_kill if url in r.updated)


async def _wait_for(predicate: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


async def run_kill_scenario(upstream: GatedUpstream, store: PolicyStore, base: dict[str, torch.Tensor],
                            victim: Victim, calls_done: Callable[[], int], *, updates: int, kill_after: int,
                            down_updates: int = 2, calls_per_version: int = 4, timeout_s: float = 600.0,
                            log: Callable[[str], None] = print) -> KillTimeline:
    """Publish versions 1..``updates`` while the caller's workers keep calls running through ``upstream``
    (a sync following ``store`` must be running); kill ``victim`` once ``kill_after`` is served, publish
    ``down_updates`` more while it is down, restart it, wait until it is back in routing, then publish the
    rest with both servers. Each version waits until it is served and ``calls_per_version`` more calls
    have completed (``calls_done``: the caller's count), so calls demonstrably flow at every stage.

    Returns the timeline; the caller judges its calls against it."""
    sync, inner = upstream.sync, upstream.inner
    assert sync is not None, "the upstream must be gated by a weight sync"
    assert updates >= kill_after + down_updates + 1, "versions are needed after the restart too"
    timeline = KillTimeline()
    stop = asyncio.Event()

    def look() -> None:
        # The routing list first: the sync sets its view before it routes, so a server seen in routing
        # is seen with the state that put it there (the gateway may run on another thread).
        now = (tuple(inner.servers), upstream.gate.version, sync.view.servers[victim.url])
        last = timeline.routing[-1] if timeline.routing else None
        if last is None or (last.servers, last.gate_version, last.victim) != now:
            timeline.routing.append(RoutingChange(time.time(), *now))

    async def watch_routing() -> None:  # fine-grained: which servers the upstream routes to, at which version
        while not stop.is_set():
            look()
            await asyncio.sleep(0.02)

    async def serve(version: int) -> None:
        await asyncio.to_thread(store.publish, version, perturbed(base, seed=version))  # as the trainer does
        await _wait_for(lambda: upstream.gate.version == version, f"version {version} served", timeout_s)
        target = calls_done() + calls_per_version
        await _wait_for(lambda: calls_done() >= target, f"{calls_per_version} calls at version {version}",
                        timeout_s)
        timeline.last_version = version
        log(f"  v{version}: routable {list(inner.servers)}; {calls_done()} calls")

    watcher = asyncio.create_task(watch_routing())
    reports_before_kill = 0
    try:
        await _wait_for(lambda: sorted(inner.servers) == sorted({*sync.view.servers}), "both servers in routing",
                        timeout_s)
        for version in range(1, kill_after + 1):
            await serve(version)
        reports_before_kill = len(sync.reports)
        await asyncio.to_thread(victim.kill)
        timeline.killed_at = time.time()
        log(f"  killed {victim.url} (SIGKILL to its process group) with {calls_done()} calls done")
        await _wait_for(lambda: victim.url not in inner.servers, "the killed server to leave routing", 120)
        timeline.left_routing_at = time.time()
        for version in range(kill_after + 1, kill_after + down_updates + 1):
            await serve(version)
            timeline.versions_while_down.append(version)
        log(f"  restarting {victim.url} ...")
        timeline.restart_began_at = time.time()
        await asyncio.to_thread(victim.restart)
        timeline.restart_healthy_at = time.time()
        await _wait_for(lambda: victim.url in inner.servers, "the restarted server back in routing", timeout_s)
        look()  # the rejoin is on the timeline before the next version is published, however busy the loop
        log(f"  {victim.url} back in routing {time.time() - timeline.restart_began_at:.1f} s after its restart began")
        for version in range(kill_after + down_updates + 1, updates + 1):
            await serve(version)
    finally:
        stop.set()
        await watcher
        timeline.reports_after_kill = list(sync.reports[reports_before_kill:])
    return timeline


def kill_process_group(process: subprocess.Popen[bytes]) -> None:
    os.killpg(os.getpgid(process.pid), signal.SIGKILL)
    process.wait(timeout=60)


# ---------------------------------------------------------------------------------------------- the bench

@dataclass
class Call:
    ended: float  # time.time()
    server: str
    recorded: int
    vllm_versions: list[int | None]
    gate_version: int


async def call_once(upstream: GatedUpstream, index: int, whole: bool) -> Call:
    request = GenerateRequest(prompt_ids=PROMPT, sampling=Sampling(temperature=1.0, max_tokens=24),
                              request_id=uuid.uuid4().hex, rollout_id=f"kill-{index}-{uuid.uuid4().hex[:6]}")
    result = await final_result(upstream, request, whole)
    spans = spans_from_text(str(result.extra["weight_versions"]))
    return Call(time.time(), result.upstream, result.policy_version,
                [label_version(s.version) for s in spans], int(result.extra["gate_version"]))  # type: ignore[arg-type]


async def run(args: argparse.Namespace, model_dir: Path, name: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    base = load_file(str(model_dir / "model.safetensors"))
    store = PolicyStore(Path(tempfile.mkdtemp(prefix="bench-weight-sync-kill-")))
    started: list[subprocess.Popen[bytes]] = []
    first = args.server
    victim_port = free_port()
    starts = [asyncio.to_thread(start_server, model_dir, name, 900.0, victim_port, SCALE_OUT)]
    if not first:  # both at once: a start takes minutes on 2 loaded cores
        starts.append(asyncio.to_thread(start_server, model_dir, name, 900.0, None, SCALE_OUT))
    servers = await asyncio.gather(*starts)
    victim_processes = [servers[0][0]]
    victim_url = servers[0][1]
    if not first:
        process, first, _ = servers[1]
        started.append(process)

    def restart() -> None:
        victim_processes.append(start_server(model_dir, name, 900.0, victim_port, SCALE_OUT)[0])

    victim = Victim(victim_url, lambda: kill_process_group(victim_processes[-1]), restart)
    inner = VLLMUpstream([first, victim_url], model=name, logprobs_mode="processed_logprobs",
                         token_endpoint="generate")
    upstream = gate_upstream(inner, store, base_dir=model_dir, interval_s=0.2)
    upstream.follow_policies(store)
    calls: list[Call] = []
    failures: list[str] = []
    stop = asyncio.Event()

    async def worker(index: int) -> None:
        while not stop.is_set():
            try:
                calls.append(await call_once(upstream, index, whole=index % 2 == 0))
            except Exception as exc:  # a failed request is a figure
                failures.append(f"{type(exc).__name__}: {exc}")

    tasks = [asyncio.create_task(worker(i)) for i in range(args.concurrency)]
    try:
        timeline = await run_kill_scenario(upstream, store, base, victim, lambda: len(calls), updates=args.updates,
                                           kill_after=args.kill_after, calls_per_version=args.calls_per_version)
        await _wait_for(lambda: any(c.server == victim_url and c.ended > timeline.killed_at
                                    for c in calls), "a call on the restarted server", 600)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        assert upstream.sync is not None
        final_versions = {url: s.version for url, s in upstream.sync.view.servers.items()}
        await upstream.close()
        for process in [*victim_processes, *started]:
            stop_server(process)

    mismatched = [c for c in calls if any(v != c.recorded for v in c.vllm_versions) or c.gate_version != c.recorded]
    after_restart = [c for c in calls if c.server == victim_url and c.ended > timeline.killed_at]
    rejoin = timeline.rejoin()
    return {
        "calls": len(calls),
        "failed_requests": len(failures),
        "first_failure": failures[0] if failures else "",
        "version_mismatches": len(mismatched),
        "calls_spanning_versions": sum(len(set(c.vllm_versions)) > 1 for c in calls),
        "versions_served_by_vllm": len({v for c in calls for v in c.vllm_versions}),
        "calls_while_down": sum(timeline.killed_at < c.ended < timeline.restart_began_at for c in calls),
        "killed_server_calls_before_kill": sum(c.server == victim_url and c.ended < timeline.killed_at
                                               for c in calls),
        "restarted_server_calls": len(after_restart),
        "restarted_calls_at_base": sum(0 in c.vllm_versions for c in after_restart),
        "rejoin_version": rejoin.gate_version,
        "rejoin_version_behind": rejoin.victim.version != rejoin.gate_version,
        "rejoin_synced_from_version": timeline.rejoin_report().previous.get(victim_url),
        # from the restart's start (vLLM takes minutes to start here) to its return into routing; the sync
        # may see the server before the bench's own /health poll does
        "restart_to_rejoin_s": round(rejoin.at - timeline.restart_began_at, 2),
        "updates_that_failed_on_killed_server": sum(victim_url in r.failed for r in timeline.reports_after_kill),
        "final_versions": final_versions,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.weight_sync_kill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=10, help="policy versions to publish (default 10)")
    parser.add_argument("--kill-after", type=int, default=3,
                        help="kill the second server once this version is served; restart it two versions later")
    parser.add_argument("--concurrency", type=int, default=4, help="calls kept running (default 4)")
    parser.add_argument("--calls-per-version", type=int, default=8,
                        help="calls that complete at each version before the next is published (default 8)")
    parser.add_argument("--server", default="",
                        help="a running vLLM (VLLM_SERVER_DEV_MODE=1, --enable-scale-out) as the first server")
    args = parser.parse_args(argv)
    from models.reference.build import build_model
    from tokentrail.settings import get_settings

    torch.set_num_threads(1)
    model_settings = get_settings().model
    model_dir = build_model(model_settings.dir)
    figures = asyncio.run(run(args, model_dir, model_settings.name))
    if args.server:  # leave the given server on its base weights, as it was
        async def restore() -> None:
            from trainer_consumer.weight_sync import WeightSync

            sync = WeightSync([args.server], PolicyStore(Path(tempfile.mkdtemp())), base_dir=model_dir)
            try:
                await sync.sync_to(0)
            finally:
                await sync.close()

        asyncio.run(restore())
    label = httpx.get(args.server + "/weight_info", timeout=30).json()["weight_version"] if args.server else ""
    emit({**figures, "given_server_label_after": label})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
