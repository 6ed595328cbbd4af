"""bench.gateway's phases: the warm-up, every request to every front in turn at concurrency 1, each front at
concurrency 64 (throughput, latency, CPU and RSS), the extra workloads and the in-process line; and the
gateway's own histograms around the main phase."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any

import httpx

from bench.gateway_targets import Servers, Target, check_alive
from bench.gateway_workload import Workloads, calls_of
from bench.http_client import Poster, concurrently, percentile, timed_call
from bench.processes import cpu_seconds, rss_mib, wait_healthy

C1Result = dict[str, tuple[list[float], float]]  # target -> (latencies in s, CPU ms per call)


async def histogram_sums(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """``{name_sum: seconds, name_count: n}`` of the gateway's histograms, from its /metrics."""
    text = (await client.get(f"{url}/metrics")).text
    sums: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.endswith(("_sum", "_count")) and "{" not in name:
            sums[name] = float(value)
    return sums


async def measure_c1(client: httpx.AsyncClient, post: Poster, targets: list[Target],
              convs: list[list[bytes]], label: str) -> dict[str, tuple[list[float], float]]:
    """Every request to every target in turn (which goes first rotates); latencies and CPU ms per call."""
    urls = {t.name: await t.urls(client, len(convs)) for t in targets}
    latencies: dict[str, list[float]] = {t.name: [] for t in targets}
    before = {t.name: cpu_seconds(t.proc.pid) for t in targets}
    total, i = sum(len(c) for c in convs), 0
    for n, conv in enumerate(convs):
        for body in conv:
            for k in range(len(targets)):
                target = targets[(i + k) % len(targets)]
                latencies[target.name].append(await timed_call(post, urls[target.name][n], body))
            i += 1
            if i % max(1, total // 5) == 0:
                print(f"  {label}: {i}/{total}", flush=True)
    return {t.name: (latencies[t.name], (cpu_seconds(t.proc.pid) - before[t.name]) / max(total, 1) * 1000)
            for t in targets}


@dataclass
class C64:
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_call: float
    rss_mib: list[float]  # after each tenth of the calls


async def measure_c64(client: httpx.AsyncClient, post: Poster, target: Target, convs: list[list[bytes]]) -> C64:
    urls = await target.urls(client, len(convs))
    total = sum(len(c) for c in convs)
    checkpoints = {max(1, total * k // 10) for k in range(1, 11)}
    rss: list[float] = []

    def on_done(done: int) -> None:
        if done in checkpoints:
            rss.append(rss_mib(target.proc.pid))
            if done % max(1, total // 5) == 0 or done == total:
                print(f"  {target.name} c64: {done}/{total}, RSS {rss[-1]:,.0f} MiB", flush=True)

    cpu_before = cpu_seconds(target.proc.pid)
    latencies, wall = await concurrently(post, [[(urls[n], b) for b in c] for n, c in enumerate(convs)], 64,
                                         on_done)
    cpu = cpu_seconds(target.proc.pid) - cpu_before
    return C64(total / wall, statistics.median(latencies) * 1000, percentile(latencies, 0.99) * 1000,
               cpu / total * 1000, rss)


@dataclass
class Measured:
    main: C1Result
    c64: dict[str, C64]
    extras: dict[str, C1Result]
    inprocess: C1Result | None
    gateway_before: dict[str, float]  # the gateway's histogram sums around the main phase
    gateway_after: dict[str, float]
    upstream_counts: dict[str, int]  # requests the upstream got, by path
    sinks: dict[str, dict[str, Any]]  # the gateways' /health sink sections at the end


async def measure(args: argparse.Namespace, servers: Servers, work: Workloads, post: Poster) -> Measured:
    """Warm-up, the main phase at concurrency 1, every front at concurrency 64, the extra workloads."""
    targets, front = servers.targets, servers.front
    inprocess, multi, gateway = servers.get("inprocess"), servers.get("multi"), servers.get("gateway")
    async with httpx.AsyncClient(timeout=60) as client:
        for target in targets.values():
            await wait_healthy(client, target.url + target.health, target.proc, target.name, timeout_s=900)
        print(f"targets: {', '.join(t.name for t in front)}" + (" (+ in-process gateway)" if inprocess else ""),
              flush=True)
        print(f"warm-up: {calls_of(work.warmup)} calls each ...", flush=True)
        await measure_c1(client, post, [*front, *([inprocess] if inprocess else [])], work.warmup, "warm-up")
        print(f"concurrency 1: {calls_of(work.timed)} calls each, in turn ...", flush=True)
        before = await histogram_sums(client, gateway.url) if gateway else {}
        main = await measure_c1(client, post, front, work.timed, "c1")
        after = await histogram_sums(client, gateway.url) if gateway else {}

        c64: dict[str, C64] = {}
        for target in front:
            check_alive(targets)
            print(f"concurrency 64: {target.name}, {calls_of(work.c64)} calls ...", flush=True)
            c64[target.name] = await measure_c64(client, post, target, work.c64)
        if multi is not None:
            check_alive(targets)
            print(f"concurrency 64: gateway in {args.processes} processes, {calls_of(work.warmup)} calls to warm up, "
                  f"then {calls_of(work.c64)} ...", flush=True)
            await measure_c64(client, post, multi, work.warmup)
            c64["multi"] = await measure_c64(client, post, multi, work.c64)

        extras = {}
        for label, convs in work.extras.items():
            print(f"{label}: {calls_of(convs)} calls each at concurrency 1 ...", flush=True)
            extras[label] = await measure_c1(client, post, front, convs, label)
        inprocess_result = None
        if inprocess is not None:
            print(f"in-process gateway: {calls_of(work.inprocess)} calls at concurrency 1 ...", flush=True)
            inprocess_result = await measure_c1(client, post, [targets["direct"], inprocess], work.inprocess,
                                                "in-process")

        upstream_counts = (await client.get(f"{targets['direct'].url}/bench/counts")).json()
        sinks = {name: (await client.get(f"{targets[name].url}/health")).json().get("sink", {})
                 for name in ("gateway", "inprocess") if name in targets}
    return Measured(main, c64, extras, inprocess_result, before, after, upstream_counts, sinks)
