"""Gateway cost on the real path: the gateway in front of a vLLM-speaking server over HTTP, side by side
with LiteLLM and a thin pass-through proxy in front of the same server, with the same requests.

Processes of their own, all on this machine:

* **upstream** (``bench/fake_vllm.py``): an instant server speaking vLLM 0.32's exact wire format (chat with
  ``return_token_ids``, completions with token-id prompts, streamed and not, logprobs). It answers at
  once, so what a front adds over calling it directly is the front's own cost. Calling it directly is
  the baseline (**direct**).
* **gateway**: the real tokentrail gateway (``producers.gateway.wiring.build_app``, the vLLM upstream client
  of ``producers/upstreams/vllm/``) in ``--prefix-mode`` (default ``splice``): it renders and tokenizes
  the conversation, sends the ids to the upstream, records the call (Avro) and answers only after the
  record is acknowledged by the local Kafka broker (acks=all, with its spool).
* **thin**: ``bench/thin_proxy.py``, httpx relaying bytes and parsing nothing (a floor for any proxy).
* **litellm**: LiteLLM's proxy (one worker) from ``.venv-litellm`` (``make setup-bench-litellm``), the
  upstream as a ``hosted_vllm`` model. Without it its figures are null and a line says how to install it.
* **sealed**: the same gateway with forgetting on (issue 31): every rollout has a subject, so every record's
  content is sealed under that subject's AES-GCM data key (keys on a topic of the run). ``sealing_cpu_ratio``
  is its CPU per call over the plain gateway's, both measured in the same rotation (target: <= 1.10).
* **in-process** (secondary line, ``--inprocess-calls``): the gateway with an in-process upstream that
  answers at once (the figure this bench used to report; it cannot see the HTTP client path).

Workloads (``--workload``; chat requests with a first user message of about ``--prompt-tokens`` tokens):

* ``agent`` (default): what agent harnesses send. Every rollout is a conversation of ``--turns`` calls;
  call k repeats the whole history (earlier answers and tool results of about ``--turn-tokens`` tokens)
  and adds one turn. Every conversation differs from its first word on. ``--group-size G`` makes G
  consecutive conversations share their task message, as the rollouts of a GRPO group do.
* ``distinct``: every call a single-turn conversation of its own (the gateway's worst case).
* ``same``: every call the same single-turn conversation (best case).

After the main workload, ``--extra-calls`` calls each of the ``distinct`` and the streamed (``stream: true``)
agent workloads are measured at concurrency 1 (``distinct_*`` and ``stream_*`` figures).

At concurrency 1 the targets are called in turn for each request (rotating which goes first), so all
see the same machine state; ``added_*`` is a target minus direct. ``*cpu_ms_per_call`` is a process's CPU
(all threads and child processes, from /proc) per call at concurrency 1. ``*calls_per_s_c64``: the
throughput with 64 calls in flight, one target after the other. ``rss_growth_fraction``: the gateway's RSS
after its concurrency-64 calls over its RSS after the first tenth of them, minus one (``rss_mib_*``
checkpoints at every tenth). The client is a minimal keep-alive HTTP/1.1 client (bench/http_client.py).

Parts: bench/gateway_workload.py (what is sent, the run's topics), bench/gateway_serve.py (the gateway process
this starts), bench/gateway_memory.py (``--memory``); this module measures and reports.

    python -m bench.gateway [--calls N] [--c64-calls N] [--workload agent|distinct|same] [--targets ...]
                            [--prefix-mode splice|retokenize|upstream] [--upstream http|inprocess] ...
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import litellm_proxy
from bench.common import emit
from bench.gateway_memory import run_memory
from bench.gateway_serve import serve
from bench.gateway_workload import CHAT, MODEL, bench_topics, conversations, output_ids_of, prompt_of_tokens, text_side
from bench.http_client import Poster, RawClient, concurrently, percentile, timed_call
from bench.processes import cpu_seconds, free_port, rss_mib, stop, wait_healthy

ALL_TARGETS = ("gateway", "sealed", "thin", "litellm")


# ---------------------------------------------------------------- the gateway's own figures and rollouts


async def _histogram_sums(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """``{name_sum: seconds, name_count: n}`` of the gateway's histograms, from its /metrics."""
    text = (await client.get(f"{url}/metrics")).text
    sums: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.endswith(("_sum", "_count")) and "{" not in name:
            sums[name] = float(value)
    return sums


def _count(before: dict[str, float], after: dict[str, float], histogram: str) -> int:
    return round(after[f"{histogram}_count"] - before[f"{histogram}_count"])


def _mean_ms(before: dict[str, float], after: dict[str, float], histogram: str) -> float:
    calls = after[f"{histogram}_count"] - before[f"{histogram}_count"]
    return (after[f"{histogram}_sum"] - before[f"{histogram}_sum"]) / max(calls, 1) * 1000


async def _start_rollouts(client: httpx.AsyncClient, url: str, count: int, subjects: bool = False) -> list[str]:
    """Start ``count`` rollouts (not timed); returns their per-attempt base paths. With ``subjects`` each
    rollout belongs to a subject of its own (its records are sealed where forgetting is on)."""
    bases: list[str] = []

    async def worker(n: int) -> None:
        for _ in range(n):
            body: dict[str, Any] = {"task_input": {"bench": True}}
            if subjects:
                body["subject"] = f"bench-user-{uuid.uuid4().hex[:12]}"
            response = await client.post(f"{url}/v1/rollouts", json=body)
            response.raise_for_status()
            body = response.json()
            bases.append(f"/rollouts/{body['rollout_id']}/attempts/{body['attempt_id']}")

    per = [count // 16 + (1 if i < count % 16 else 0) for i in range(16)]
    await asyncio.gather(*(worker(n) for n in per))
    return bases


# ---------------------------------------------------------------- the targets


@dataclass
class Target:
    """A server the same requests go to; a gateway has one URL per rollout (its conversations' paths)."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    health: str = "/health"
    gateway: bool = False
    subjects: bool = False  # its rollouts have subjects (the sealed gateway)
    cpu_s: float = 0.0
    latencies: dict[str, list[float]] = field(default_factory=dict)

    async def urls(self, client: httpx.AsyncClient, conversations: int) -> list[str]:
        """One chat URL per conversation (not timed: a gateway's rollouts are started here)."""
        if not self.gateway:
            return [self.url + CHAT] * conversations
        bases = await _start_rollouts(client, self.url, conversations, self.subjects)
        return [self.url + base + CHAT for base in bases]


async def _c1(client: httpx.AsyncClient, post: Poster, targets: list[Target],
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


async def _c64(client: httpx.AsyncClient, post: Poster, target: Target, convs: list[list[bytes]]) -> C64:
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


def _check_alive(targets: dict[str, Target]) -> None:
    for target in targets.values():
        if target.proc.poll() is not None:
            raise RuntimeError(f"the {target.name} server exited ({target.proc.returncode})")


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


# ---------------------------------------------------------------- the run


# ---------------------------------------------------------------- the run, step by step

C1Result = dict[str, tuple[list[float], float]]  # target -> (latencies in s, CPU ms per call)


@dataclass
class Workloads:
    """Every phase's request bodies, grouped by conversation, made before any server starts."""

    prompt_tokens: int
    warmup: list[list[bytes]]
    timed: list[list[bytes]]
    c64: list[list[bytes]]
    extras: dict[str, list[list[bytes]]]  # distinct, stream: measured at concurrency 1 after the main one
    inprocess: list[list[bytes]]


def _workloads(args: argparse.Namespace, text: Any, answer: str) -> Workloads:
    content = prompt_of_tokens(text, args.prompt_tokens)
    prompt_len = len(text.render_chat([{"role": "user", "content": content}], None,
                                      prefix_mode="retokenize", prior=[]).prompt_ids)

    def phase(workload: str, calls: int, seed: int, stream: bool = False) -> list[list[bytes]]:
        turns = args.turns if workload == "agent" else 1
        return conversations(workload, calls, turns, content, answer, args.turn_tokens, args.output_tokens,
                             seed, args.group_size, stream)

    extras = {"distinct": phase("distinct", args.extra_calls, 4),
              "stream": phase("agent", args.extra_calls, 5, stream=True)} if args.extra_calls else {}
    return Workloads(prompt_len, phase(args.workload, args.warmup, 1), phase(args.workload, args.calls, 2),
                     phase(args.workload, args.c64_calls, 3), extras, phase(args.workload, args.inprocess_calls, 6))


def _calls(*phases: list[list[bytes]]) -> int:
    return sum(len(conversation) for phase in phases for conversation in phase)


@dataclass
class Servers:
    """The processes a run starts: the upstream (**direct**) and the fronts in front of it."""

    workdir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    targets: dict[str, Target] = field(default_factory=dict)

    def spawn(self, name: str, argv: list[str], health: str = "/health", gateway: bool = False,
              subjects: bool = False) -> Target:
        port = free_port()
        proc = subprocess.Popen([a.replace("{port}", str(port)) for a in argv])
        self.procs.append(proc)
        self.targets[name] = Target(name, proc, f"http://127.0.0.1:{port}", health, gateway, subjects)
        return self.targets[name]

    @property
    def front(self) -> list[Target]:
        """The targets compared side by side (the in-process and multi-process gateways are extra lines)."""
        return [t for name, t in self.targets.items() if name not in ("inprocess", "multi")]

    def get(self, name: str) -> Target | None:
        return self.targets.get(name)


def _start_servers(args: argparse.Namespace, servers: Servers, text: Any, output_ids: list[int],
                   calls_topic: str, env_topic: str) -> None:
    python, workdir = sys.executable, servers.workdir
    upstream = servers.spawn("direct", [
        python, "-m", "bench.fake_vllm", "--port", "{port}", "--model", MODEL, "--max-model-len",
        str(args.max_model_len), "--vocab-size", str(text.vocab_size),
        "--output", orjson.dumps({"ids": output_ids, "pieces": [text.decode([i]) for i in output_ids]}).decode()])
    serve_gateway = [python, "-m", "bench.gateway", "--output-tokens", str(args.output_tokens), "--serve",
                     "--port", "{port}", "--prefix-mode", args.prefix_mode, "--calls-topic", calls_topic,
                     "--env-topic", env_topic, *(["--no-fast-ascii"] if args.no_fast_ascii else [])]
    wanted = args.targets.split(",")
    if "gateway" in wanted:
        servers.spawn("gateway", [*serve_gateway, "--spool-dir", str(workdir / "spool"),
                                  *(["--upstream-url", upstream.url] if args.upstream == "http" else [])], gateway=True)
    if "sealed" in wanted:
        servers.spawn("sealed", [*serve_gateway, "--spool-dir", str(workdir / "spool-sealed"),
                                 "--seal-keys-topic", args.keys_topic,
                                 *(["--upstream-url", upstream.url] if args.upstream == "http" else [])],
                      gateway=True, subjects=True)
    if "thin" in wanted:
        servers.spawn("thin", [python, "-m", "bench.thin_proxy", "--port", "{port}", "--upstream", upstream.url])
    if "litellm" in wanted and litellm_proxy.available():
        port = free_port()
        proc = litellm_proxy.start(port, upstream.url, MODEL, workdir)
        servers.procs.append(proc)
        servers.targets["litellm"] = Target("litellm", proc, f"http://127.0.0.1:{port}", litellm_proxy.HEALTH_PATH)
    elif "litellm" in wanted:
        print(f"{litellm_proxy.INSTALL_HINT}; its figures are null", flush=True)
    if args.processes > 1 and "gateway" in wanted:
        servers.spawn("multi", [*serve_gateway, "--spool-dir", str(workdir / "spool-multi"), "--processes",
                                str(args.processes), "--upstream-url", upstream.url], gateway=True)
    if args.inprocess_calls and args.upstream == "http" and "gateway" in wanted:
        servers.spawn("inprocess", [*serve_gateway, "--spool-dir", str(workdir / "spool-inprocess")], gateway=True)


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


async def _measure(args: argparse.Namespace, servers: Servers, work: Workloads, post: Poster) -> Measured:
    """Warm-up, the main phase at concurrency 1, every front at concurrency 64, the extra workloads."""
    targets, front = servers.targets, servers.front
    inprocess, multi, gateway = servers.get("inprocess"), servers.get("multi"), servers.get("gateway")
    async with httpx.AsyncClient(timeout=60) as client:
        for target in targets.values():
            await wait_healthy(client, target.url + target.health, target.proc, target.name, timeout_s=900)
        print(f"targets: {', '.join(t.name for t in front)}" + (" (+ in-process gateway)" if inprocess else ""),
              flush=True)
        print(f"warm-up: {_calls(work.warmup)} calls each ...", flush=True)
        await _c1(client, post, [*front, *([inprocess] if inprocess else [])], work.warmup, "warm-up")
        print(f"concurrency 1: {_calls(work.timed)} calls each, in turn ...", flush=True)
        before = await _histogram_sums(client, gateway.url) if gateway else {}
        main = await _c1(client, post, front, work.timed, "c1")
        after = await _histogram_sums(client, gateway.url) if gateway else {}

        c64: dict[str, C64] = {}
        for target in front:
            _check_alive(targets)
            print(f"concurrency 64: {target.name}, {_calls(work.c64)} calls ...", flush=True)
            c64[target.name] = await _c64(client, post, target, work.c64)
        if multi is not None:
            _check_alive(targets)
            print(f"concurrency 64: gateway in {args.processes} processes, {_calls(work.warmup)} calls to warm up, "
                  f"then {_calls(work.c64)} ...", flush=True)
            await _c64(client, post, multi, work.warmup)
            c64["multi"] = await _c64(client, post, multi, work.c64)

        extras = {}
        for label, convs in work.extras.items():
            print(f"{label}: {_calls(convs)} calls each at concurrency 1 ...", flush=True)
            extras[label] = await _c1(client, post, front, convs, label)
        inprocess_result = None
        if inprocess is not None:
            print(f"in-process gateway: {_calls(work.inprocess)} calls at concurrency 1 ...", flush=True)
            inprocess_result = await _c1(client, post, [targets["direct"], inprocess], work.inprocess, "in-process")

        upstream_counts = (await client.get(f"{targets['direct'].url}/bench/counts")).json()
        sinks = {name: (await client.get(f"{targets[name].url}/health")).json().get("sink", {})
                 for name in ("gateway", "inprocess") if name in targets}
    return Measured(main, c64, extras, inprocess_result, before, after, upstream_counts, sinks)


def _gateway_calls(servers: Servers, work: Workloads) -> int:
    """Calls the gateways took, each of which must have put its record on the calls topic."""
    calls = _calls(work.warmup, work.timed, work.c64, *work.extras.values()) if servers.get("gateway") else 0
    calls += _calls(work.warmup, work.timed, work.c64, *work.extras.values()) if servers.get("sealed") else 0
    calls += _calls(work.warmup, work.inprocess) if servers.get("inprocess") else 0
    return calls + (_calls(work.warmup, work.c64) if servers.get("multi") else 0)


def _records_on_kafka(kafka: Any, admin: Any, topic: str, group: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    from schemas.kafka.config import consumer_config

    consumer = Consumer(consumer_config(kafka, group))
    try:
        partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions)
    finally:
        consumer.close()


def _c1_figures(result: C1Result, name: str, prefix: str) -> dict[str, Any]:
    """A target's concurrency-1 figures: added latency over direct, and its CPU per call."""
    if name not in result:
        return {f"{prefix}added_p50_ms_c1": None, f"{prefix}cpu_ms_per_call": None}
    lat, cpu = result[name]
    direct = result["direct"][0]
    return {f"{prefix}added_p50_ms_c1": (statistics.median(lat) - statistics.median(direct)) * 1000,
            f"{prefix}added_p99_ms_c1": (percentile(lat, 0.99) - percentile(direct, 0.99)) * 1000,
            f"{prefix}cpu_ms_per_call": cpu}


def _comparison_figures(args: argparse.Namespace, work: Workloads, m: Measured) -> dict[str, Any]:
    """The gateway beside direct, the thin proxy and LiteLLM, and the ratios between them."""
    gw, thin, lite = (m.c64.get(n) for n in ("gateway", "thin", "litellm"))
    figures = {
        "path": "http" if args.upstream == "http" else "in-process",
        "prompt_tokens": work.prompt_tokens,
        "direct_p50_ms_c1": statistics.median(m.main["direct"][0]) * 1000,
        **_c1_figures(m.main, "gateway", ""),
        "calls_per_s_c64": gw.calls_per_s if gw else None,
        "gateway_p50_ms_c64": gw.p50_ms if gw else None,
        "gateway_p99_ms_c64": gw.p99_ms if gw else None,
        "cpu_ms_per_call_c64": gw.cpu_ms_per_call if gw else None,
        **_c1_figures(m.main, "litellm", "litellm_"),
        "litellm_calls_per_s_c64": lite.calls_per_s if lite else None,
        **_c1_figures(m.main, "thin", "thin_"),
        "thin_calls_per_s_c64": thin.calls_per_s if thin else None,
        **_c1_figures(m.main, "sealed", "sealed_"),
        "sealed_calls_per_s_c64": m.c64["sealed"].calls_per_s if "sealed" in m.c64 else None,
        "direct_cpu_ms_per_call": m.main["direct"][1],
        "direct_calls_per_s_c64": m.c64["direct"].calls_per_s,
    }
    return figures | {
        "cpu_vs_litellm": _ratio(figures["cpu_ms_per_call"], figures["litellm_cpu_ms_per_call"]),
        "added_p50_vs_litellm": _ratio(figures["added_p50_ms_c1"], figures["litellm_added_p50_ms_c1"]),
        "throughput_vs_litellm": _ratio(figures["calls_per_s_c64"], figures["litellm_calls_per_s_c64"]),
        "throughput_vs_thin": _ratio(figures["calls_per_s_c64"], figures["thin_calls_per_s_c64"]),
        "cpu_vs_thin": _ratio(figures["cpu_ms_per_call"], figures["thin_cpu_ms_per_call"]),
        # Issue 31: what sealing subjects' content costs the gateway (target <= 1.10).
        "sealing_cpu_ratio": _ratio(figures["sealed_cpu_ms_per_call"], figures["cpu_ms_per_call"]),
        "sealing_throughput_ratio": _ratio(figures["sealed_calls_per_s_c64"], figures["calls_per_s_c64"]),
    }


def _secondary_figures(args: argparse.Namespace, figures: dict[str, Any], m: Measured, work: Workloads
                       ) -> dict[str, Any]:
    """Several processes, memory, the extra workloads, the in-process line and the gateway's own timings."""
    out: dict[str, Any] = {}
    if "multi" in m.c64:
        several = m.c64["multi"]
        out |= {"processes": args.processes, "calls_per_s_c64_processes": several.calls_per_s,
                "cpu_ms_per_call_c64_processes": several.cpu_ms_per_call,
                "gateway_p50_ms_c64_processes": several.p50_ms,
                "processes_vs_one": _ratio(several.calls_per_s, figures["calls_per_s_c64"]),
                "processes_vs_thin": _ratio(several.calls_per_s, figures["thin_calls_per_s_c64"]),
                "rss_mib_end_processes": several.rss_mib[-1] if several.rss_mib else None}
    gw = m.c64.get("gateway")
    if gw and gw.rss_mib:
        out |= {"rss_growth_fraction": gw.rss_mib[-1] / gw.rss_mib[0] - 1,
                "rss_mib_first_tenth_c64": gw.rss_mib[0], "rss_mib_end": gw.rss_mib[-1]}
    else:
        out["rss_growth_fraction"] = None
    for name in ("thin", "litellm"):
        if name in m.c64 and m.c64[name].rss_mib:
            out[f"{name}_rss_mib_end"] = m.c64[name].rss_mib[-1]
    for label, result in m.extras.items():
        out |= _c1_figures(result, "gateway", f"{label}_")
        out |= _c1_figures(result, "litellm", f"{label}_litellm_")
        out |= _c1_figures(result, "thin", f"{label}_thin_")
    if m.inprocess is not None:
        out |= _c1_figures(m.inprocess, "inprocess", "inprocess_")
    if m.gateway_after:
        out |= {"render_cpu_ms_per_call": _mean_ms(m.gateway_before, m.gateway_after,
                                                   "tokentrail_gateway_render_seconds"),
                "delivery_wait_ms_c1": _mean_ms(m.gateway_before, m.gateway_after,
                                                "tokentrail_gateway_delivery_seconds"),
                # How many calls each mean is over (0: the figure measured nothing, whatever it reads); the
                # main phase's rollouts are started before their calls, and their starts are delivered too.
                "c1_calls": _calls(work.timed), "c1_rollouts": len(work.timed),
                "render_calls": _count(m.gateway_before, m.gateway_after, "tokentrail_gateway_render_seconds"),
                "delivery_calls": _count(m.gateway_before, m.gateway_after, "tokentrail_gateway_delivery_seconds")}
    return out


def _delivery_figures(args: argparse.Namespace, m: Measured, servers: Servers, on_kafka: int,
                      gateway_calls: int) -> dict[str, Any]:
    """Whether every call took the real path and its record reached Kafka, and how the run was set up."""
    return {
        # The real path: the gateway's token-in calls reached the upstream over HTTP.
        "upstream_completions_requests": m.upstream_counts.get("/v1/completions", 0),
        "upstream_chat_requests": m.upstream_counts.get(CHAT, 0),
        "records_on_kafka": on_kafka, "gateway_calls": gateway_calls, "workload": args.workload,
        "prefix_mode": args.prefix_mode, "fast_ascii_tokenize": not args.no_fast_ascii,
        "turns_per_conversation": args.turns if args.workload == "agent" else 1,
        "group_size": args.group_size if args.workload == "agent" else 1,
        "litellm_version": litellm_proxy.VERSION if servers.get("litellm") else None,
        "spool_depth_at_end": max((s.get("spool_depth", -1) for s in m.sinks.values()), default=-1),
        "delivery_errors": sum(s.get("delivery_errors", 0) for s in m.sinks.values()),
    }


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """The comparison: make the workloads, start the servers, measure, check delivery, compute the figures."""
    from tokentrail.settings import get_settings

    settings = get_settings()
    print(f"Kafka at {settings.kafka.bootstrap_servers} ...", flush=True)
    tag = uuid.uuid4().hex[:8]
    calls_topic, env_topic = f"bench.gateway.calls.{tag}", f"bench.gateway.env.{tag}"
    args.keys_topic = f"bench.gateway.keys.{tag}"  # the sealed gateway's key store makes it (compacted)
    text = text_side()
    output_ids = output_ids_of(text, args.output_tokens)
    work = _workloads(args, text, text.decode(output_ids))
    longest = max(len(b) for c in work.timed for b in c)
    print(f"workload {args.workload}: first prompt {work.prompt_tokens} tokens (largest body {longest} bytes of "
          f"JSON); output {args.output_tokens} tokens; gateway prefix mode {args.prefix_mode}, upstream "
          f"{args.upstream}", flush=True)
    with bench_topics(settings.kafka, calls_topic, env_topic) as admin:
        servers = Servers(Path(tempfile.mkdtemp(prefix="bench-gateway-")))
        raw = RawClient()
        try:
            _start_servers(args, servers, text, output_ids, calls_topic, env_topic)
            measured = await _measure(args, servers, work, raw.post)
        finally:
            await raw.close()
            stop(servers.procs)
            for future in admin.delete_topics([args.keys_topic], operation_timeout=30).values():
                try:
                    future.result(timeout=60)
                except Exception:  # not made (no sealed target): nothing to delete
                    pass
        on_kafka = _records_on_kafka(settings.kafka, admin, calls_topic, f"bench-{tag}")
    figures = _comparison_figures(args, work, measured)
    return figures | _secondary_figures(args, figures, measured, work) | _delivery_figures(
        args, measured, servers, on_kafka, _gateway_calls(servers, work))


def _summary(f: dict[str, Any]) -> None:
    """The side-by-side table a person reads first."""
    def show(value: Any, fmt: str = ",.1f") -> str:
        return "n/a" if value is None else format(value, fmt)

    print(f"\n{'target':<10} {'added p50 ms c1':>16} {'CPU ms/call c1':>15} {'calls/s c64':>12}")
    for name, prefix in (("tokentrail", ""), ("sealed", "sealed_"), ("thin", "thin_"), ("litellm", "litellm_")):
        print(f"{name:<10} {show(f.get(prefix + 'added_p50_ms_c1')):>16} {show(f.get(prefix + 'cpu_ms_per_call')):>15} "
              f"{show(f.get(prefix + 'calls_per_s_c64')):>12}")
    print(f"tokentrail vs LiteLLM: CPU x{show(f.get('cpu_vs_litellm'), '.2f')}, added p50 "
          f"x{show(f.get('added_p50_vs_litellm'), '.2f')}, throughput x{show(f.get('throughput_vs_litellm'), '.2f')}; "
          f"vs thin: throughput x{show(f.get('throughput_vs_thin'), '.2f')}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway",
        description="Latency, CPU, throughput and memory the gateway adds in front of a vLLM-speaking server over "
                    "HTTP (durable Kafka delivery of every call record included), side by side with LiteLLM and a "
                    "thin pass-through proxy.")
    parser.add_argument("--calls", type=int, default=400, help="timed calls per target at concurrency 1")
    parser.add_argument("--c64-calls", type=int, default=3000, help="calls per target at concurrency 64")
    parser.add_argument("--warmup", type=int, default=50, help="untimed calls per target first")
    parser.add_argument("--extra-calls", type=int, default=100,
                        help="calls of each extra workload (distinct, streamed) at concurrency 1; 0: none")
    parser.add_argument("--inprocess-calls", type=int, default=100,
                        help="calls through a second gateway with an in-process upstream (secondary line); 0: none")
    parser.add_argument("--targets", default=",".join(ALL_TARGETS),
                        help="comma-separated fronts to measure beside direct: gateway, thin, litellm")
    parser.add_argument("--prompt-tokens", type=int, default=4096, help="rendered prompt length")
    parser.add_argument("--output-tokens", type=int, default=16, help="sampled tokens per call")
    parser.add_argument("--max-model-len", type=int, default=32768, help="the upstream model's context")
    parser.add_argument("--workload", choices=["agent", "distinct", "same"], default="agent",
                        help="agent: multi-turn conversations, each call extending the previous one (default); "
                        "distinct: a new single-turn conversation per call; same: one conversation for all")
    parser.add_argument("--turns", type=int, default=8, help="calls per conversation in the agent workload")
    parser.add_argument("--group-size", type=int, default=1,
                        help="agent workload: conversations per group sharing their task prompt")
    parser.add_argument("--turn-tokens", type=int, default=128,
                        help="words of tool result added per turn in the agent workload")
    parser.add_argument("--prefix-mode", choices=["splice", "retokenize", "upstream"], default="splice",
                        help="the gateway's prefix mode (default splice; upstream: pass-through, the upstream "
                        "renders)")
    parser.add_argument("--upstream", choices=["http", "inprocess"], default="http",
                        help="http: the gateway talks to the fake vLLM over HTTP (the real path, default); "
                        "inprocess: the gateway's upstream answers in its own process")
    parser.add_argument("--processes", type=int, default=1,
                        help="also measure, at concurrency 64, the gateway as this many processes behind one port "
                        "(rollout-sticky, producers/gateway/peers.py); 1: not measured")
    parser.add_argument("--memory", action="store_true",
                        help="instead of the comparison: the gateway's RSS after --memory-checkpoint and after "
                        "--memory-calls distinct requests on the real path (rollouts started and finished)")
    parser.add_argument("--memory-calls", type=int, default=50_000, help="calls in the memory run")
    parser.add_argument("--memory-checkpoint", type=int, default=5_000,
                        help="calls after which the memory run's reference RSS is read")
    parser.add_argument("--memory-prompt-tokens", type=int, default=64, help="first message of the memory run")
    parser.add_argument("--memory-turn-words", type=int, default=16, help="words of each later turn there")
    parser.add_argument("--memory-concurrency", type=int, default=32, help="conversations in flight there")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES",
                        help="memory run: trace the gateway's allocations (FRAMES deep) and print what grew at "
                        "each checkpoint (slow; for finding what grows)")
    parser.add_argument("--no-fast-ascii", action="store_true",
                        help="tokenize with the tokenizer itself, not the exact ASCII fast path (for comparison)")
    # Internal: run a gateway (the benchmark starts it as a subprocess).
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream-url", help=argparse.SUPPRESS)
    parser.add_argument("--spool-dir", help=argparse.SUPPRESS)
    parser.add_argument("--process", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--peer-ports", help=argparse.SUPPRESS)
    parser.add_argument("--calls-topic", help=argparse.SUPPRESS)
    parser.add_argument("--env-topic", help=argparse.SUPPRESS)
    parser.add_argument("--seal-keys-topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args)
    if args.memory:
        figures = asyncio.run(run_memory(args))
        print(f"\nRSS {figures['rss_mib_at_checkpoint']:,.0f} MiB after {figures['memory_checkpoint_calls']:,} "
              f"calls, {figures['rss_mib_at_end']:,.0f} MiB after {figures['memory_calls']:,}: growth "
              f"{figures['rss_growth_fraction']:+.1%}\n")
        emit(figures)
        return 0
    figures = asyncio.run(run_bench(args))
    if figures["records_on_kafka"] < figures["gateway_calls"]:
        print(f"WARNING: only {figures['records_on_kafka']} of {figures['gateway_calls']} call records "
              "are on Kafka", file=sys.stderr)
    _summary(figures)
    emit(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
