"""Gateway cost on the real path: the gateway in front of a vLLM-speaking server over HTTP, side by side
with LiteLLM and a thin pass-through proxy in front of the same server, with the same requests.

Processes of their own, all on this machine:

* **upstream** (``bench/fake_vllm.py``): an instant server speaking vLLM 0.32's exact wire format (chat with
  ``return_token_ids``, completions with token-id prompts, streamed and not, logprobs). It answers at
  once, so what a front adds over calling it directly is the front's own cost. Calling it directly is
  the baseline (**direct**).
* **gateway**: the real tokentrail gateway (``producers.gateway.wiring.build_app``, the vLLM upstream client
  of ``producers/upstreams/vllm.py``) in ``--prefix-mode`` (default ``splice``): it renders and tokenizes
  the conversation, sends the ids to the upstream, records the call (Avro) and answers only after the
  record is acknowledged by the local Kafka broker (acks=all, with its spool).
* **thin**: ``bench/thin_proxy.py``, httpx relaying bytes and parsing nothing (a floor for any proxy).
* **litellm**: LiteLLM's proxy (one worker) from ``.venv-litellm`` (``make setup-bench-litellm``), the
  upstream as a ``hosted_vllm`` model. Without it its figures are null and a line says how to install it.
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

    python -m bench.gateway [--calls N] [--c64-calls N] [--workload agent|distinct|same] [--targets ...]
                            [--prefix-mode splice|retokenize|upstream] [--upstream http|inprocess] ...
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench import litellm_proxy
from bench.common import emit
from bench.http_client import Poster, RawClient, concurrently, percentile, timed_call
from bench.processes import cpu_seconds, free_port, rss_mib, stop, wait_healthy
from producers.upstreams.base import ChatGenerateRequest, GenerateRequest, GenerateResult, TokenChunk

OUTPUT_TEXT = "The answer is forty-two, and here is why it holds in every case we tried."
MODEL = "bench"
CHAT = "/v1/chat/completions"
ALL_TARGETS = ("gateway", "thin", "litellm")


# ---------------------------------------------------------------- the in-process upstream (secondary line)


class FastUpstream:
    """An Upstream that samples nothing: it answers at once with fixed output ids."""

    name = "bench-fast"

    def __init__(self, output_ids: list[int], vocab_size: int = 256, chars_per_token: float = 1.5) -> None:
        self.output_ids = output_ids
        self.logprobs = [-0.5] * len(output_ids)
        self.prompt_pool = np.random.default_rng(0).integers(0, vocab_size, 1 << 16).astype(np.uint32)
        self.chars_per_token = chars_per_token

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        n = min(request.sampling.max_tokens, len(self.output_ids))
        return GenerateResult(
            prompt_ids=request.prompt_ids, output_ids=self.output_ids[:n],
            output_logprobs=self.logprobs[:n], finish_reason="length" if n < len(self.output_ids) else "stop",
            logprob_kind="RAW", policy_version=0, engine="bench/fast", upstream="in-process",
        )

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        result = await self.generate(request)
        yield TokenChunk(result.output_ids, result.output_logprobs)
        yield result

    async def generate_chat_stream(self, request: ChatGenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        """Pass-through: a model server that renders for free. It reports a prompt as long as the
        conversation's text would tokenize to (ids drawn once; each turn's prompt extends the last's)."""
        chars = sum(len(str(m.get("content") or "")) for m in request.messages)
        prompt = self.prompt_pool[: min(len(self.prompt_pool), 16 + int(chars / self.chars_per_token))]
        result = await self.generate(GenerateRequest(prompt, request.sampling, request.request_id))
        yield TokenChunk(result.output_ids, result.output_logprobs, prompt_ids=prompt)
        yield result

    async def policy_version(self) -> int:
        return 0

    async def close(self) -> None:
        return None


def _text_side(fast_ascii: bool = True) -> Any:
    """The configured model's text side: the reference model, or a family's with settings ``model.family``
    and ``model.dir`` (``TOKENTRAIL_MODEL__FAMILY=qwen3 TOKENTRAIL_MODEL__DIR=...``: a 150K vocabulary)."""
    from producers.gateway.family_text_side import text_side_for
    from producers.gateway.wiring import build_configured_model, cache_budgets
    from tokentrail.settings import get_settings

    settings = get_settings()
    return text_side_for(build_configured_model(settings, progress=lambda _: None), fast_ascii=fast_ascii,
                         caches=cache_budgets(settings.gateway))


def _output_ids(text: Any, count: int) -> list[int]:
    ids = text.encode_text(OUTPUT_TEXT)
    while len(ids) < count:
        ids += ids
    return ids[:count]


def gateway_app(spool_dir: str, calls_topic: str, env_topic: str, output_tokens: int,
                prefix_mode: str = "splice", fast_ascii: bool = True, upstream_url: str = "") -> Any:
    """The standard gateway app; over HTTP to ``upstream_url`` (the real vLLM client), else in-process."""
    from producers.delivery import CallPublisher
    from producers.gateway.wiring import build_app
    from tokentrail.settings import get_settings

    settings = get_settings()
    gateway = {"spool_dir": Path(spool_dir), "prefix_mode": prefix_mode, "fast_ascii_tokenize": fast_ascii}
    if upstream_url:
        gateway |= {"upstream": upstream_url, "vllm_model": MODEL}
    settings = settings.model_copy(update={
        "model": settings.model.model_copy(update={"name": MODEL}),
        "gateway": settings.gateway.model_copy(update=gateway),
    })
    text = _text_side(fast_ascii)
    upstream = None
    if not upstream_url:
        sample = text.render_text([{"role": "user", "content": _prompt(text, 512)}], None)
        chars_per_token = len(sample) / len(text.encode_text(sample))
        upstream = FastUpstream(_output_ids(text, output_tokens), text.vocab_size, chars_per_token)
    return build_app(
        settings, upstream=upstream, publisher=CallPublisher.from_settings(settings.kafka, settings.gateway),
        text=text, topics={"calls_topic": calls_topic, "env_topic": env_topic}, progress=lambda _: None,
    )


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    if args.processes > 1 and args.process is None:
        return serve_processes(args)
    spool_dir = args.spool_dir if args.process is None else str(Path(args.spool_dir) / f"process-{args.process}")
    app = gateway_app(spool_dir, args.calls_topic, args.env_topic, args.output_tokens, args.prefix_mode,
                      not args.no_fast_ascii, args.upstream_url or "")
    if args.tracemalloc:
        app = _with_tracemalloc(app, args.tracemalloc)
    # The client keeps its connections (timeout_keep_alive): no race with idle closes.
    config = {"log_level": "warning", "access_log": False, "timeout_keep_alive": 120}
    if args.process is None:
        uvicorn.run(app, host="127.0.0.1", port=args.port, **config)
        return 0
    from producers.gateway.peers import StickyRouter, shared_socket

    peers = [f"http://127.0.0.1:{p}" for p in args.peer_ports.split(",")]
    own = int(args.peer_ports.split(",")[args.process])
    sockets = [shared_socket("127.0.0.1", args.port), shared_socket("127.0.0.1", own)]
    uvicorn.Server(uvicorn.Config(StickyRouter(app, args.process, peers), **config)).run(sockets=sockets)
    return 0


def serve_processes(args: argparse.Namespace) -> int:
    """``--processes N``: N gateway processes on the one port, rollout-sticky (producers/gateway/peers.py),
    as children of this one (so the benchmark reads their CPU and RSS as one server's)."""
    import signal

    peer_ports = ",".join(str(free_port()) for _ in range(args.processes))
    argv = [a for a in sys.argv]
    children = [subprocess.Popen([sys.executable, "-m", "bench.gateway", *argv[1:], "--process", str(n),
                                  "--peer-ports", peer_ports]) for n in range(args.processes)]

    def stop_children(*_: Any) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop_children)
    signal.signal(signal.SIGINT, stop_children)
    codes = [child.wait() for child in children]
    return max(codes, default=0)


def _with_tracemalloc(app: Any, frames: int) -> Any:
    """``app`` with tracemalloc on and ``GET /bench/tracemalloc`` answering what grew since the last such
    request, by allocating line (for finding what grows per request; costs CPU, never in timed runs)."""
    import tracemalloc

    tracemalloc.start(frames)
    last: list[Any] = [tracemalloc.take_snapshot()]

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/bench/tracemalloc":
            await app(scope, receive, send)
            return
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        stats = snapshot.compare_to(last[0], "traceback")[:25]
        last[0] = snapshot
        lines = []
        for stat in stats:
            lines.append(f"{stat.size_diff / 1e6:+.2f} MB {stat.count_diff:+d} blocks")
            lines.extend(f"    {line}" for line in stat.traceback.format()[-2 * frames:])
        body = "\n".join(lines).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})

    return wrapped


# ---------------------------------------------------------------- requests


def _prompt(text: Any, tokens: int) -> str:
    """A user message whose rendered chat prompt has about ``tokens`` tokens."""
    rng = random.Random(0)
    vocabulary = ["alpha", "river", "stone", "quietly", "compute", "seven", "orange", "because", "table",
                  "the", "of", "model", "gradient", "window", "north", "plain", "under", "vector"]
    words = [rng.choice(vocabulary) for _ in range(tokens)]
    for _ in range(4):
        content = " ".join(words)
        rendered = len(text.render_chat([{"role": "user", "content": content}], None,
                                        prefix_mode="retokenize", prior=[]).prompt_ids)
        if abs(rendered - tokens) <= 8:
            break
        words = (words * 2)[: max(1, int(len(words) * tokens / rendered))]
    return content


def _words(rng: random.Random, count: int) -> str:
    vocabulary = ["result", "found", "line", "file", "error", "value", "returns", "match", "path", "ok",
                  "status", "count", "test", "passed", "module", "config", "key", "index"]
    return " ".join(rng.choice(vocabulary) for _ in range(count))


def conversations(workload: str, calls: int, turns: int, first: str, answer: str, turn_tokens: int,
                  max_tokens: int, seed: int, group_size: int = 1, stream: bool = False) -> list[list[bytes]]:
    """Request bodies, grouped by conversation (one rollout each), at least ``calls`` calls in all. In
    the agent workload, ``group_size`` consecutive conversations share their first message (a group).
    ``stream``: the requests ask for a streamed answer."""
    rng = random.Random(seed)

    def body(messages: list[dict[str, str]]) -> bytes:
        request: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 1.0}
        if stream:
            request["stream"] = True
        return orjson.dumps(request)

    if workload == "same":
        return [[body([{"role": "user", "content": first}])] for _ in range(calls)]
    if workload == "distinct":
        return [[body([{"role": "user", "content": f"case-{seed}-{n}-{uuid.uuid4().hex[:6]} {first}"}])]
                for n in range(calls)]
    out = []
    for n in range(-(-calls // turns)):
        if n % group_size == 0:
            task = f"task-{seed}-{n}-{uuid.uuid4().hex[:6]} {first}"
        messages = [{"role": "user", "content": task}]
        bodies = [body(messages)]
        for _ in range(turns - 1):
            messages = [*messages, {"role": "assistant", "content": answer},
                        {"role": "user", "content": _words(rng, turn_tokens)}]
            bodies.append(body(messages))
        out.append(bodies)
    return out


async def _histogram_sums(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """``{name_sum: seconds, name_count: n}`` of the gateway's histograms, from its /metrics."""
    text = (await client.get(f"{url}/metrics")).text
    sums: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.endswith(("_sum", "_count")) and "{" not in name:
            sums[name] = float(value)
    return sums


def _mean_ms(before: dict[str, float], after: dict[str, float], histogram: str) -> float:
    calls = after[f"{histogram}_count"] - before[f"{histogram}_count"]
    return (after[f"{histogram}_sum"] - before[f"{histogram}_sum"]) / max(calls, 1) * 1000


async def _start_rollouts(client: httpx.AsyncClient, url: str, count: int) -> list[str]:
    """Start ``count`` rollouts (not timed); returns their per-attempt base paths."""
    bases: list[str] = []

    async def worker(n: int) -> None:
        for _ in range(n):
            response = await client.post(f"{url}/v1/rollouts", json={"task_input": {"bench": True}})
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
    cpu_s: float = 0.0
    latencies: dict[str, list[float]] = field(default_factory=dict)

    async def urls(self, client: httpx.AsyncClient, conversations: int) -> list[str]:
        """One chat URL per conversation (not timed: a gateway's rollouts are started here)."""
        if not self.gateway:
            return [self.url + CHAT] * conversations
        return [self.url + base + CHAT for base in await _start_rollouts(client, self.url, conversations)]


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


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from schemas.kafka_config import admin_config, consumer_config
    from tokentrail import kafka_local
    from tokentrail.settings import get_settings

    settings = get_settings()
    print(f"Kafka at {settings.kafka.bootstrap_servers} ...", flush=True)
    if not kafka_local.broker_answers(settings.kafka):
        kafka_local.start(wait_s=120, kafka=settings.kafka)
    admin = AdminClient(admin_config(settings.kafka))
    tag = uuid.uuid4().hex[:8]
    calls_topic, env_topic = f"bench.gateway.calls.{tag}", f"bench.gateway.env.{tag}"
    for future in admin.create_topics([NewTopic(calls_topic, 6, replication_factor=-1),
                                       NewTopic(env_topic, 6, replication_factor=-1)]).values():
        future.result(timeout=60)

    text = _text_side()
    content = _prompt(text, args.prompt_tokens)
    prompt_len = len(text.render_chat([{"role": "user", "content": content}], None,
                                      prefix_mode="retokenize", prior=[]).prompt_ids)
    output_ids = _output_ids(text, args.output_tokens)
    answer = text.decode(output_ids)

    def phase(workload: str, calls: int, seed: int, stream: bool = False) -> list[list[bytes]]:
        turns = args.turns if workload == "agent" else 1
        return conversations(workload, calls, turns, content, answer, args.turn_tokens, args.output_tokens,
                             seed, args.group_size, stream)

    warmup, timed, c64 = phase(args.workload, args.warmup, 1), phase(args.workload, args.calls, 2), \
        phase(args.workload, args.c64_calls, 3)
    extras = {"distinct": phase("distinct", args.extra_calls, 4),
              "stream": phase("agent", args.extra_calls, 5, stream=True)} if args.extra_calls else {}
    n_c1 = sum(len(c) for c in timed)
    longest = max(len(b) for c in timed for b in c)
    print(f"workload {args.workload}: first prompt {prompt_len} tokens (largest body {longest} bytes of JSON); "
          f"output {args.output_tokens} tokens; gateway prefix mode {args.prefix_mode}, upstream {args.upstream}",
          flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    procs: list[subprocess.Popen[bytes]] = []
    targets: dict[str, Target] = {}

    def spawn(name: str, argv: list[str], health: str = "/health", gateway: bool = False) -> Target:
        port = free_port()
        proc = subprocess.Popen([a.replace("{port}", str(port)) for a in argv])
        procs.append(proc)
        targets[name] = Target(name, proc, f"http://127.0.0.1:{port}", health, gateway)
        return targets[name]

    python = sys.executable
    upstream = spawn("direct", [python, "-m", "bench.fake_vllm", "--port", "{port}", "--model", MODEL,
                                "--max-model-len", str(args.max_model_len), "--vocab-size", str(text.vocab_size),
                                "--output", orjson.dumps({"ids": output_ids,
                                                          "pieces": [text.decode([i]) for i in output_ids]}).decode()])
    serve_gateway = [python, "-m", "bench.gateway", "--output-tokens", str(args.output_tokens), "--serve",
                     "--port", "{port}", "--prefix-mode", args.prefix_mode, "--calls-topic", calls_topic,
                     "--env-topic", env_topic, *(["--no-fast-ascii"] if args.no_fast_ascii else [])]
    wanted = args.targets.split(",")
    if "gateway" in wanted:
        spawn("gateway", [*serve_gateway, "--spool-dir", str(workdir / "spool"),
                          *(["--upstream-url", upstream.url] if args.upstream == "http" else [])], gateway=True)
    if "thin" in wanted:
        spawn("thin", [python, "-m", "bench.thin_proxy", "--port", "{port}", "--upstream", upstream.url])
    litellm_missing = "litellm" in wanted and not litellm_proxy.available()
    if "litellm" in wanted and not litellm_missing:
        port = free_port()
        proc = litellm_proxy.start(port, upstream.url, MODEL, workdir)
        procs.append(proc)
        targets["litellm"] = Target("litellm", proc, f"http://127.0.0.1:{port}", litellm_proxy.HEALTH_PATH)
    if litellm_missing:
        print(f"{litellm_proxy.INSTALL_HINT}; its figures are null", flush=True)
    multi = None
    if args.processes > 1 and "gateway" in wanted:
        multi = spawn("multi", [*serve_gateway, "--spool-dir", str(workdir / "spool-multi"), "--processes",
                                str(args.processes), "--upstream-url", upstream.url], gateway=True)
    inprocess = None
    if args.inprocess_calls and args.upstream == "http" and "gateway" in wanted:
        inprocess = spawn("inprocess", [*serve_gateway, "--spool-dir", str(workdir / "spool-inprocess")],
                          gateway=True)

    figures: dict[str, Any] = {}
    raw = RawClient()
    post: Poster = raw.post
    gateway_calls = 0
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            for target in targets.values():
                await wait_healthy(client, target.url + target.health, target.proc, target.name, timeout_s=900)
            front = [t for name, t in targets.items() if name not in ("inprocess", "multi")]
            print(f"targets: {', '.join(t.name for t in front)} (+ in-process gateway)" if inprocess else
                  f"targets: {', '.join(t.name for t in front)}", flush=True)

            print(f"warm-up: {sum(len(c) for c in warmup)} calls each ...", flush=True)
            await _c1(client, post, [*front, *([inprocess] if inprocess else [])], warmup, "warm-up")
            print(f"concurrency 1: {n_c1} calls each, in turn ...", flush=True)
            gateway_before = await _histogram_sums(client, targets["gateway"].url) if "gateway" in targets else {}
            main = await _c1(client, post, front, timed, "c1")
            gateway_after = await _histogram_sums(client, targets["gateway"].url) if "gateway" in targets else {}

            c64_results: dict[str, C64] = {}
            for target in front:
                _check_alive(targets)
                print(f"concurrency 64: {target.name}, {sum(len(c) for c in c64)} calls ...", flush=True)
                c64_results[target.name] = await _c64(client, post, target, c64)
            if multi is not None:
                _check_alive(targets)
                print(f"concurrency 64: gateway in {args.processes} processes, {sum(len(c) for c in warmup)} "
                      f"calls to warm up, then {sum(len(c) for c in c64)} ...", flush=True)
                await _c64(client, post, multi, warmup)
                c64_results["multi"] = await _c64(client, post, multi, c64)

            extra_results = {}
            for label, convs in extras.items():
                print(f"{label}: {sum(len(c) for c in convs)} calls each at concurrency 1 ...", flush=True)
                extra_results[label] = await _c1(client, post, front, convs, label)

            inprocess_result = None
            if inprocess is not None:
                convs = phase(args.workload, args.inprocess_calls, 6)
                print(f"in-process gateway: {sum(len(c) for c in convs)} calls at concurrency 1 ...", flush=True)
                inprocess_result = await _c1(client, post, [upstream, inprocess], convs, "in-process")

            upstream_counts = (await client.get(f"{upstream.url}/bench/counts")).json()
            sinks = {}
            for name in ("gateway", "inprocess"):
                if name in targets:
                    sinks[name] = (await client.get(f"{targets[name].url}/health")).json().get("sink", {})
        gateway_calls = sum(sum(len(c) for c in p) for p in (warmup, timed, c64, *extras.values())) \
            if "gateway" in targets else 0
        gateway_calls += sum(sum(len(c) for c in p) for p in (warmup, phase(args.workload, args.inprocess_calls, 6))) \
            if inprocess is not None else 0
        gateway_calls += sum(sum(len(c) for c in p) for p in (warmup, c64)) if multi is not None else 0

        consumer = Consumer(consumer_config(settings.kafka, f"bench-{tag}"))
        metadata = admin.list_topics(calls_topic, timeout=30).topics[calls_topic]
        on_kafka = sum(consumer.get_watermark_offsets(TopicPartition(calls_topic, p), timeout=30)[1]
                       for p in metadata.partitions)
        consumer.close()

        direct_s = main["direct"][0]
        direct_p50 = statistics.median(direct_s)

        def c1_figures(result: dict[str, tuple[list[float], float]], name: str, prefix: str) -> dict[str, Any]:
            if name not in result:
                return {f"{prefix}added_p50_ms_c1": None, f"{prefix}cpu_ms_per_call": None}
            lat, cpu = result[name]
            base = statistics.median(result["direct"][0])
            return {f"{prefix}added_p50_ms_c1": (statistics.median(lat) - base) * 1000,
                    f"{prefix}added_p99_ms_c1": (percentile(lat, 0.99) - percentile(result["direct"][0], 0.99)) * 1000,
                    f"{prefix}cpu_ms_per_call": cpu}

        gw, thin, lite = (c64_results.get(n) for n in ("gateway", "thin", "litellm"))
        figures = {
            "path": "http" if args.upstream == "http" else "in-process",
            "prompt_tokens": prompt_len,
            "direct_p50_ms_c1": direct_p50 * 1000,
            **c1_figures(main, "gateway", ""),
            "calls_per_s_c64": gw.calls_per_s if gw else None,
            "gateway_p50_ms_c64": gw.p50_ms if gw else None,
            "gateway_p99_ms_c64": gw.p99_ms if gw else None,
            "cpu_ms_per_call_c64": gw.cpu_ms_per_call if gw else None,
            **c1_figures(main, "litellm", "litellm_"),
            "litellm_calls_per_s_c64": lite.calls_per_s if lite else None,
            **c1_figures(main, "thin", "thin_"),
            "thin_calls_per_s_c64": thin.calls_per_s if thin else None,
            "direct_cpu_ms_per_call": main["direct"][1],
            "direct_calls_per_s_c64": c64_results["direct"].calls_per_s,
        }
        figures |= {
            "cpu_vs_litellm": _ratio(figures["cpu_ms_per_call"], figures["litellm_cpu_ms_per_call"]),
            "added_p50_vs_litellm": _ratio(figures["added_p50_ms_c1"], figures["litellm_added_p50_ms_c1"]),
            "throughput_vs_litellm": _ratio(figures["calls_per_s_c64"], figures["litellm_calls_per_s_c64"]),
            "throughput_vs_thin": _ratio(figures["calls_per_s_c64"], figures["thin_calls_per_s_c64"]),
            "cpu_vs_thin": _ratio(figures["cpu_ms_per_call"], figures["thin_cpu_ms_per_call"]),
        }
        if "multi" in c64_results:
            several = c64_results["multi"]
            figures |= {"processes": args.processes, "calls_per_s_c64_processes": several.calls_per_s,
                        "cpu_ms_per_call_c64_processes": several.cpu_ms_per_call,
                        "gateway_p50_ms_c64_processes": several.p50_ms,
                        "processes_vs_one": _ratio(several.calls_per_s, figures["calls_per_s_c64"]),
                        "processes_vs_thin": _ratio(several.calls_per_s, figures["thin_calls_per_s_c64"]),
                        "rss_mib_end_processes": several.rss_mib[-1] if several.rss_mib else None}
        if gw and gw.rss_mib:
            figures |= {"rss_growth_fraction": gw.rss_mib[-1] / gw.rss_mib[0] - 1,
                        "rss_mib_first_tenth_c64": gw.rss_mib[0], "rss_mib_end": gw.rss_mib[-1]}
        else:
            figures["rss_growth_fraction"] = None
        for name in ("thin", "litellm"):
            if name in c64_results and c64_results[name].rss_mib:
                figures[f"{name}_rss_mib_end"] = c64_results[name].rss_mib[-1]
        for label, result in extra_results.items():
            figures |= c1_figures(result, "gateway", f"{label}_")
            figures |= c1_figures(result, "litellm", f"{label}_litellm_")
            figures |= c1_figures(result, "thin", f"{label}_thin_")
        if inprocess_result is not None:
            figures |= c1_figures(inprocess_result, "inprocess", "inprocess_")
        if gateway_after:
            figures |= {
                "render_cpu_ms_per_call": _mean_ms(gateway_before, gateway_after, "tokentrail_gateway_render_seconds"),
                "delivery_wait_ms_c1": _mean_ms(gateway_before, gateway_after, "tokentrail_gateway_delivery_seconds"),
            }
        figures |= {
            # The real path: the gateway's token-in calls reached the upstream over HTTP.
            "upstream_completions_requests": upstream_counts.get("/v1/completions", 0),
            "upstream_chat_requests": upstream_counts.get(CHAT, 0),
            "records_on_kafka": on_kafka, "gateway_calls": gateway_calls, "workload": args.workload,
            "prefix_mode": args.prefix_mode, "fast_ascii_tokenize": not args.no_fast_ascii,
            "turns_per_conversation": args.turns if args.workload == "agent" else 1,
            "group_size": args.group_size if args.workload == "agent" else 1,
            "litellm_version": litellm_proxy.VERSION if "litellm" in targets else None,
            "spool_depth_at_end": max((s.get("spool_depth", -1) for s in sinks.values()), default=-1),
            "delivery_errors": sum(s.get("delivery_errors", 0) for s in sinks.values()),
        }
    finally:
        await raw.close()
        stop(procs)
        for future in admin.delete_topics([calls_topic, env_topic], operation_timeout=30).values():
            try:
                future.result(timeout=60)
            except Exception as exc:  # best effort: the figures matter more than the cleanup
                print(f"could not delete a bench topic: {exc}", file=sys.stderr)
    return figures


# ---------------------------------------------------------------- the memory run


def _memory_conversations(count: int, turns: int, first: str, answer: str, turn_words: int, max_tokens: int,
                          seed: int) -> Iterator[list[bytes]]:
    """``count`` conversations of ``turns`` calls, made as they are needed (50k calls would hold hundreds
    of MB in the client): every one differs from its first word on, so every call is a distinct request."""
    rng = random.Random(seed)
    for n in range(count):
        messages = [{"role": "user", "content": f"memory-{seed}-{n}-{uuid.uuid4().hex[:8]} {first}"}]
        bodies = []
        for turn in range(turns):
            if turn:
                messages = [*messages, {"role": "assistant", "content": answer},
                            {"role": "user", "content": _words(rng, turn_words)}]
            bodies.append(orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens,
                                        "temperature": 1.0}))
        yield bodies


async def run_memory(args: argparse.Namespace) -> dict[str, Any]:
    """RSS of the gateway (real path, splice by default) after ``--memory-checkpoint`` and after
    ``--memory-calls`` distinct requests: conversations of ``--turns`` calls on a small first message,
    each in a rollout started before and finished after (as an environment does), ``--memory-concurrency``
    at a time. Figures: the RSS at each checkpoint and the growth fraction between the first and the end,
    with what the byte-bounded parts hold (/health: the text side's caches, the attempt registry)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from schemas.kafka_config import admin_config
    from tokentrail import kafka_local
    from tokentrail.settings import get_settings

    settings = get_settings()
    if not kafka_local.broker_answers(settings.kafka):
        kafka_local.start(wait_s=120, kafka=settings.kafka)
    admin = AdminClient(admin_config(settings.kafka))
    tag = uuid.uuid4().hex[:8]
    calls_topic, env_topic = f"bench.gateway.mem-calls.{tag}", f"bench.gateway.mem-env.{tag}"
    for future in admin.create_topics([NewTopic(calls_topic, 6, replication_factor=-1),
                                       NewTopic(env_topic, 6, replication_factor=-1)]).values():
        future.result(timeout=60)
    text = _text_side()
    first = _prompt(text, args.memory_prompt_tokens)
    output_ids = _output_ids(text, args.output_tokens)
    answer = text.decode(output_ids)
    total = args.memory_calls
    checkpoints = sorted({min(args.memory_checkpoint, total), *range(args.memory_checkpoint, total, 5000), total})
    workdir = Path(tempfile.mkdtemp(prefix="bench-gateway-memory-"))
    python = sys.executable
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(argv: list[str]) -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        procs.append(subprocess.Popen([a.replace("{port}", str(port)) for a in argv]))
        return procs[-1], f"http://127.0.0.1:{port}"

    upstream, upstream_url = spawn([
        python, "-m", "bench.fake_vllm", "--port", "{port}", "--model", MODEL, "--vocab-size", str(text.vocab_size),
        "--output", orjson.dumps({"ids": output_ids, "pieces": [text.decode([i]) for i in output_ids]}).decode()])
    async with httpx.AsyncClient(timeout=60) as client:  # before the next port is drawn: it could be the same
        await wait_healthy(client, upstream_url + "/health", upstream, "upstream")
    gateway, url = spawn([
        python, "-m", "bench.gateway", "--output-tokens", str(args.output_tokens), "--serve", "--port", "{port}",
        "--prefix-mode", args.prefix_mode, "--calls-topic", calls_topic, "--env-topic", env_topic,
        "--spool-dir", str(workdir / "spool"), "--upstream-url", upstream_url,
        *(["--tracemalloc", str(args.tracemalloc)] if args.tracemalloc else [])])
    raw = RawClient()
    rows: list[dict[str, Any]] = []
    done = 0
    next_checkpoint = 0
    print(f"memory run: {total:,} distinct calls ({args.turns}-call conversations, first message "
          f"{args.memory_prompt_tokens} tokens), {args.memory_concurrency} at a time; RSS at "
          f"{', '.join(f'{c:,}' for c in checkpoints)}", flush=True)
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            await wait_healthy(client, url + "/health", gateway, "gateway", timeout_s=900)
            conversations = _memory_conversations(-(-total // args.turns), args.turns, first, answer,
                                                  args.memory_turn_words, args.output_tokens, 7)
            began = time.perf_counter()

            async def checkpoint() -> None:
                health = (await client.get(url + "/health")).json()
                row = {"calls": done, "rss_mib": rss_mib(gateway.pid), "text_caches": health.get("text_caches"),
                       "registry_bytes": health["registry_memory"]["bytes"],
                       "calls_per_s": done / (time.perf_counter() - began)}
                rows.append(row)
                caches = row["text_caches"] or {}
                held = ", ".join(f"{name} {c['bytes'] / 2**20:,.1f}/{c['max_bytes'] / 2**20:,.0f} MiB"
                                 for name, c in caches.items())
                print(f"  {done:,}/{total:,} calls: RSS {row['rss_mib']:,.0f} MiB; {held}; registry "
                      f"{row['registry_bytes'] / 2**20:,.1f} MiB; {row['calls_per_s']:,.0f} calls/s", flush=True)
                if args.tracemalloc:
                    print((await client.get(url + "/bench/tracemalloc", timeout=600)).text, flush=True)

            lock = asyncio.Lock()

            async def worker() -> None:
                nonlocal done, next_checkpoint
                for bodies in conversations:
                    status, data = await raw.post(url + "/v1/rollouts", b'{"task_input": {"bench": "memory"}}')
                    if status != 201:
                        raise RuntimeError(f"start: HTTP {status}: {data[:300]!r}")
                    started = orjson.loads(data)
                    base = f"{url}/rollouts/{started['rollout_id']}/attempts/{started['attempt_id']}"
                    for body in bodies:
                        status, data = await raw.post(base + CHAT, body)
                        if status != 200:
                            raise RuntimeError(f"call: HTTP {status}: {data[:300]!r}")
                        done += 1
                        if next_checkpoint < len(checkpoints) and done >= checkpoints[next_checkpoint]:
                            next_checkpoint += 1
                            async with lock:
                                await checkpoint()
                    finish = (f"{url}/v1/rollouts/{started['rollout_id']}/attempts/{started['attempt_id']}"
                              "/finish")
                    status, data = await raw.post(finish, b'{"status": "SUCCESS"}')
                    if status != 200:
                        raise RuntimeError(f"finish: HTTP {status}: {data[:300]!r}")

            await asyncio.gather(*(worker() for _ in range(args.memory_concurrency)))
            wall = time.perf_counter() - began
            counts = (await client.get(upstream_url + "/bench/counts")).json()
    finally:
        await raw.close()
        stop(procs)
        for future in admin.delete_topics([calls_topic, env_topic], operation_timeout=30).values():
            try:
                future.result(timeout=60)
            except Exception as exc:  # best effort
                print(f"could not delete a bench topic: {exc}", file=sys.stderr)
    first_row, last_row = rows[0], rows[-1]
    caches = last_row["text_caches"] or {}
    return {
        "mode": "memory", "path": "http", "prefix_mode": args.prefix_mode, "memory_calls": done,
        "memory_checkpoint_calls": first_row["calls"], "turns_per_conversation": args.turns,
        "first_message_tokens": args.memory_prompt_tokens,
        "rss_mib_at_checkpoint": first_row["rss_mib"], "rss_mib_at_end": last_row["rss_mib"],
        "rss_growth_fraction": last_row["rss_mib"] / first_row["rss_mib"] - 1,
        "rss_mib_checkpoints": {str(r["calls"]): round(r["rss_mib"], 1) for r in rows},
        **{f"{name}_bytes_at_end": c["bytes"] for name, c in caches.items()},
        **{f"{name}_max_bytes": c["max_bytes"] for name, c in caches.items()},
        "registry_bytes_at_checkpoint": first_row["registry_bytes"],
        "registry_bytes_at_end": last_row["registry_bytes"],
        "calls_per_s": done / wall, "upstream_completions_requests": counts.get("/v1/completions", 0),
    }


def _summary(f: dict[str, Any]) -> None:
    """The side-by-side table a person reads first."""
    def show(value: Any, fmt: str = ",.1f") -> str:
        return "n/a" if value is None else format(value, fmt)

    print(f"\n{'target':<10} {'added p50 ms c1':>16} {'CPU ms/call c1':>15} {'calls/s c64':>12}")
    for name, prefix in (("tokentrail", ""), ("thin", "thin_"), ("litellm", "litellm_")):
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
