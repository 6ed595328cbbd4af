"""A vLLM server killed mid-run: two servers behind the gated vLLM upstream, one killed with SIGKILL while
calls run and versions are published, then restarted on the same port.

What it checks, call by call (not assumed):
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

    python -m bench.weight_sync_kill [--updates 12] [--kill-after 3] [--server URL]

Both servers run with VLLM_SERVER_DEV_MODE=1 and --enable-scale-out. ``--server``: a running one to use
as the first server (the second is always started here, as it is the one killed). Last line: one JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass
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
from tokentrail.commands.weight_sync import GatedUpstream, gate_upstream

SCALE_OUT = ("--enable-scale-out",)


@dataclass
class Call:
    ended: float
    server: str
    recorded: int
    vllm_versions: list[int | None]
    gate_version: int


async def call_once(upstream: GatedUpstream, index: int, whole: bool) -> Call:
    request = GenerateRequest(prompt_ids=PROMPT, sampling=Sampling(temperature=1.0, max_tokens=24),
                              request_id=uuid.uuid4().hex, rollout_id=f"kill-{index}-{uuid.uuid4().hex[:6]}")
    result = await final_result(upstream, request, whole)
    spans = spans_from_text(str(result.extra["weight_versions"]))
    return Call(time.monotonic(), result.upstream, result.policy_version,
                [label_version(s.version) for s in spans], int(result.extra["gate_version"]))  # type: ignore[arg-type]


async def run(args: argparse.Namespace, model_dir: Path, name: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    base = load_file(str(model_dir / "model.safetensors"))
    store = PolicyStore(Path(tempfile.mkdtemp(prefix="bench-weight-sync-kill-")))
    started: list[Any] = []
    first = args.server
    victim_port = free_port()
    starts = [asyncio.to_thread(start_server, model_dir, name, 900.0, victim_port, SCALE_OUT)]
    if not first:  # both at once: a start takes minutes on 2 loaded cores
        starts.append(asyncio.to_thread(start_server, model_dir, name, 900.0, None, SCALE_OUT))
    servers = await asyncio.gather(*starts)
    victim_process, victim, _ = servers[0]
    if not first:
        process, first, _ = servers[1]
        started.append(process)
    inner = VLLMUpstream([first, victim], model=name, logprobs_mode="processed_logprobs", token_endpoint="generate")
    upstream = gate_upstream(inner, store, base_dir=model_dir, interval_s=0.2)
    assert upstream.sync is not None
    sync = upstream.sync
    upstream.follow_policies(store)
    calls: list[Call] = []
    failures: list[str] = []
    stop = asyncio.Event()
    routing: list[tuple[float, tuple[str, ...], int]] = []  # (when, routable servers, gate version) on change

    async def worker(index: int) -> None:
        while not stop.is_set():
            try:
                calls.append(await call_once(upstream, index, whole=index % 2 == 0))
            except Exception as exc:  # a failed request is a figure
                failures.append(f"{type(exc).__name__}: {exc}")

    async def watch_routing() -> None:
        while not stop.is_set():
            now = (tuple(inner.servers), upstream.gate.version)
            if not routing or routing[-1][1:] != now:
                routing.append((time.monotonic(), *now))
            await asyncio.sleep(0.02)

    async def wait_for(predicate: Any, what: str, timeout_s: float = 900.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}")
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(worker(i)) for i in range(args.concurrency)] + [asyncio.create_task(watch_routing())]
    killed_at = restarted_at = 0.0
    try:
        await wait_for(lambda: sorted(inner.servers) == sorted([first, victim]) and len(calls) > 2, "both servers")
        for version in range(1, args.updates + 1):
            await asyncio.to_thread(store.publish, version, perturbed(base, seed=version))
            await wait_for(lambda v=version: upstream.gate.version == v, f"version {version} served")  # type: ignore[misc]
            await asyncio.sleep(args.gap)
            print(f"  v{version}: routable {inner.servers}; {len(calls)} calls, {len(failures)} failed", flush=True)
            if version == args.kill_after:
                os.killpg(os.getpgid(victim_process.pid), signal.SIGKILL)
                victim_process.wait(timeout=60)
                killed_at = time.monotonic()
                print(f"  killed {victim} (SIGKILL to its process group) with {len(calls)} calls done", flush=True)
                await wait_for(lambda: victim not in inner.servers, "the killed server to leave routing", 60)
            if version == args.kill_after + 2:
                print(f"  restarting {victim} ...", flush=True)
                victim_process, _, _ = await asyncio.to_thread(start_server, model_dir, name, 900.0, victim_port,
                                                               SCALE_OUT)
                restarted_at = time.monotonic()
        await wait_for(lambda: victim in inner.servers, "the restarted server to rejoin routing")
        await wait_for(lambda: any(c.server == victim and c.ended > restarted_at for c in calls),
                       "a call on the restarted server")
        await asyncio.sleep(args.gap)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await upstream.close()
        for process in [victim_process, *started]:
            stop_server(process)

    mismatched = [c for c in calls if any(v != c.recorded for v in c.vllm_versions) or c.gate_version != c.recorded]
    after_restart = [c for c in calls if c.server == victim and c.ended > restarted_at]
    rejoin = next(r for r in routing if r[0] >= restarted_at and victim in r[1])
    target_at_rejoin = rejoin[2]
    reports = [r for r in sync.reports if victim in r.failed]
    return {
        "calls": len(calls),
        "failed_requests": len(failures),
        "first_failure": failures[0] if failures else "",
        "version_mismatches": len(mismatched),
        "calls_spanning_versions": sum(len(set(c.vllm_versions)) > 1 for c in calls),
        "versions_served_by_vllm": len({v for c in calls for v in c.vllm_versions}),
        "calls_while_killed": sum(killed_at < c.ended < restarted_at for c in calls),
        "killed_server_calls_before_kill": sum(c.server == victim and c.ended < killed_at for c in calls),
        "restarted_server_calls": len(after_restart),
        "restarted_calls_at_base": sum(0 in c.vllm_versions for c in after_restart),
        "rejoin_version": target_at_rejoin,
        "rejoin_version_behind": target_at_rejoin < max(c.recorded for c in calls if c.ended <= rejoin[0]),
        "restart_to_rejoin_s": round(rejoin[0] - restarted_at, 2),
        "updates_that_failed_on_killed_server": len(reports),
        "final_versions": {url: s.version for url, s in sync.view.servers.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.weight_sync_kill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=10, help="policy versions to publish (default 10)")
    parser.add_argument("--kill-after", type=int, default=3,
                        help="kill the second server once this version is served; restart it two versions later")
    parser.add_argument("--concurrency", type=int, default=4, help="calls kept running (default 4)")
    parser.add_argument("--gap", type=float, default=2.0, help="seconds of calls at each version (default 2)")
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
