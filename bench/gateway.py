"""Gateway overhead: the same chat requests sent straight to a model server and through the gateway.

Two servers run in processes of their own, on the same HTTP stack (uvicorn + Starlette):

* **direct**: answers ``POST /v1/chat/completions`` at once with a fixed completion, as an
  infinitely fast model server would (it parses the request; it does not tokenize);
* **gateway**: the real tokentrail gateway app with an in-process upstream that answers at once. It
  renders and tokenizes the conversation, records the call (Avro) and returns only after the record
  is acknowledged by the local Kafka broker (acks=all, the production sink with its spool).

Workloads (``--workload``), all with a first user message of about ``--prompt-tokens`` tokens (4k):

* ``agent`` (default): what agent harnesses send. Every rollout is a conversation of ``--turns`` calls;
  call k repeats the whole history (the earlier assistant answers and tool results of about
  ``--turn-tokens`` tokens each) and adds one turn, so each call's prompt extends the previous call's.
  Every conversation differs from its first word on, so only a rollout's own earlier calls can be reused.
  ``--group-size G`` makes G consecutive conversations share their task message, as the rollouts of a
  GRPO group do (each then gets tool results of its own): their first calls reuse the group's tokens.
* ``distinct``: every call a single-turn conversation of its own; nothing tokenized before can be
  reused (the gateway's worst case).
* ``same``: every call the same single-turn conversation, as the rollouts of one group send it (best case).

``--prefix-mode`` sets the gateway's mode (default ``splice``). With ``upstream`` (pass-through) the
gateway neither renders nor tokenizes: the in-process upstream plays a model server that renders for
free and reports prompt ids as long as the conversation's text would give. ``--no-fast-ascii`` makes
the gateway tokenize with the tokenizer itself instead of the exact ASCII fast path
(``producers/ascii_encoder.py``): the same ids, for comparing the cost.

Rollouts are started before timing. At concurrency 1 the two servers are called
alternately, so both see the same machine state; ``added_*`` is gateway minus direct.
``cpu_ms_per_call`` is the gateway process's CPU time (all its threads: HTTP, rendering, encoding,
librdkafka) per call at concurrency 1. Where it goes: ``direct_cpu_ms_per_call`` is the direct
server's CPU per call in the same phase (the HTTP stack both share, so a floor under any gateway on
it; ``cpu_ratio_vs_direct`` compares the two), ``render_cpu_ms_per_call`` the gateway's own measure
of rendering and tokenizing (its ``tokentrail_gateway_render_seconds`` metric) and
``delivery_wait_ms_c1`` the mean wait for the Kafka acknowledgement. ``calls_per_s_c64`` is the
throughput of one gateway process with 64 calls in flight, and ``direct_calls_per_s_c64`` the same
client against the direct server (the ceiling the client and machine allow). The client runs on the
same machine; by default it is a minimal keep-alive HTTP/1.1 client (``--client raw``: prebuilt
requests, httptools parsing), because httpx costs several ms of CPU per call and would cap
throughput at c64 far below the servers' own (``--client httpx`` measures with it).

    python -m bench.gateway [--calls N] [--c64-calls N] [--prompt-tokens T] [--output-tokens K]
                            [--workload agent|distinct|same] [--turns N] [--turn-tokens T] [--group-size G]
                            [--prefix-mode splice|retokenize|upstream] [--no-fast-ascii] [--client raw|httpx]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import orjson

from bench.common import emit
from producers.upstreams.base import ChatGenerateRequest, GenerateRequest, GenerateResult, TokenChunk

OUTPUT_TEXT = "The answer is forty-two, and here is why it holds in every case we tried."
MODEL = "bench"


# ---------------------------------------------------------------- the two servers


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
    from models.reference.build import build_model
    from producers.gateway.text_side import ModelTextSide
    from tokentrail.settings import get_settings

    return ModelTextSide.from_dir(build_model(get_settings().model.dir), fast_ascii=fast_ascii)


def _output_ids(text: Any, count: int) -> list[int]:
    ids = text.encode_text(OUTPUT_TEXT)
    while len(ids) < count:
        ids += ids
    return ids[:count]


def direct_app(output_text: str, completion_tokens: int) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        answer = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", MODEL),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": output_text},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 0, "completion_tokens": completion_tokens,
                      "total_tokens": completion_tokens},
        }
        return Response(orjson.dumps(answer), media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/health", health, methods=["GET"])])


def gateway_app(spool_dir: str, calls_topic: str, env_topic: str, output_tokens: int,
                prefix_mode: str = "splice", fast_ascii: bool = True) -> Any:
    from producers.delivery import CallPublisher
    from producers.gateway.wiring import build_app
    from tokentrail.settings import get_settings

    settings = get_settings()
    settings = settings.model_copy(update={
        "model": settings.model.model_copy(update={"name": MODEL}),
        "gateway": settings.gateway.model_copy(update={"spool_dir": Path(spool_dir), "prefix_mode": prefix_mode,
                                                       "fast_ascii_tokenize": fast_ascii}),
    })
    text = _text_side(fast_ascii)
    sample = text.render_text([{"role": "user", "content": _prompt(text, 512)}], None)
    chars_per_token = len(sample) / len(text.encode_text(sample))
    return build_app(
        settings, upstream=FastUpstream(_output_ids(text, output_tokens), text.vocab_size, chars_per_token),
        publisher=CallPublisher.from_settings(settings.kafka, settings.gateway), text=text,
        topics={"calls_topic": calls_topic, "env_topic": env_topic}, progress=lambda _: None,
    )


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    if args.serve == "direct":
        text = _text_side()
        app = direct_app(text.decode(_output_ids(text, args.output_tokens)), args.output_tokens)
    else:
        app = gateway_app(args.spool_dir, args.calls_topic, args.env_topic, args.output_tokens, args.prefix_mode,
                          not args.no_fast_ascii)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                timeout_keep_alive=120)  # the client keeps its connections; no race with idle closes
    return 0


# ---------------------------------------------------------------- the client side


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    """user + system CPU of a process (all threads) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


async def _wait_healthy(
    client: httpx.AsyncClient, url: str, proc: subprocess.Popen[bytes], what: str
) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the {what} server exited ({proc.returncode})")
        try:
            if (await client.get(f"{url}/health")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the {what} server did not become healthy")


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


class _RawConnection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON and reads one response at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        import httptools

        head = (f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        chunks: list[bytes] = []
        complete: list[bool] = []

        class Events:
            def on_body(self, data: bytes) -> None:
                chunks.append(data)

            def on_message_complete(self) -> None:
                complete.append(True)

        parser = httptools.HttpResponseParser(Events())
        while not complete:
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection")
            parser.feed_data(data)
        return parser.get_status_code(), b"".join(chunks)


class RawClient:
    """Pools of raw keep-alive connections per server; timed calls only (setup uses httpx)."""

    def __init__(self) -> None:
        self._idle: dict[str, list[_RawConnection]] = {}
        self._all: list[_RawConnection] = []

    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        parts = urlsplit(url)
        netloc = parts.netloc
        idle = self._idle.setdefault(netloc, [])
        if idle:
            conn = idle.pop()
        else:
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            conn = _RawConnection(reader, writer, netloc)
            self._all.append(conn)
        status, data = await conn.post(parts.path, body)
        idle.append(conn)
        return status, data

    async def close(self) -> None:
        for conn in self._all:
            conn.writer.close()


Poster = Callable[[str, bytes], Any]


def _poster(kind: str, client: httpx.AsyncClient, raw: RawClient) -> Poster:
    async def with_httpx(url: str, body: bytes) -> tuple[int, bytes]:
        response = await client.post(url, content=body, headers={"content-type": "application/json"})
        return response.status_code, response.content

    return raw.post if kind == "raw" else with_httpx


async def _call(post: Poster, url: str, body: bytes) -> float:
    began = time.perf_counter()
    status, data = await post(url, body)
    elapsed = time.perf_counter() - began
    if status != 200:
        raise RuntimeError(f"{url}: HTTP {status}: {data[:300]!r}")
    return elapsed


async def _concurrently(post: Poster, conversations: list[list[tuple[str, bytes]]],
                        workers: int) -> tuple[list[float], float]:
    """Run every conversation (its calls in order, as one harness would) from ``workers`` concurrent
    workers; latencies of every call and wall seconds."""
    queue = list(conversations)
    latencies: list[float] = []

    async def worker() -> None:
        while queue:
            for url, body in queue.pop():
                latencies.append(await _call(post, url, body))

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return latencies, time.perf_counter() - began


def _words(rng: random.Random, count: int) -> str:
    vocabulary = ["result", "found", "line", "file", "error", "value", "returns", "match", "path", "ok",
                  "status", "count", "test", "passed", "module", "config", "key", "index"]
    return " ".join(rng.choice(vocabulary) for _ in range(count))


def conversations(workload: str, calls: int, turns: int, first: str, answer: str, turn_tokens: int,
                  max_tokens: int, seed: int, group_size: int = 1) -> list[list[bytes]]:
    """Request bodies, grouped by conversation (one rollout each), at least ``calls`` calls in all. In
    the agent workload, ``group_size`` consecutive conversations share their first message (a group)."""
    rng = random.Random(seed)

    def body(messages: list[dict[str, str]]) -> bytes:
        return orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 1.0})

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


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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
    answer = text.decode(_output_ids(text, args.output_tokens))
    turns = args.turns if args.workload == "agent" else 1

    def phase(calls: int, seed: int) -> list[list[bytes]]:
        return conversations(args.workload, calls, turns, content, answer, args.turn_tokens, args.output_tokens,
                             seed, args.group_size)

    warmup, timed, c64 = phase(args.warmup, 1), phase(args.calls, 2), phase(args.c64_calls, 3)
    total = sum(len(c) for c in warmup + timed + c64)
    n_c1, n_c64 = sum(len(c) for c in timed), sum(len(c) for c in c64)
    longest = max(len(b) for c in timed for b in c)
    print(f"workload {args.workload}: first prompt {prompt_len} tokens, {turns} call(s) per conversation "
          f"(largest body {longest} bytes of JSON); output: {args.output_tokens} tokens; client: {args.client}",
          flush=True)

    spool = tempfile.mkdtemp(prefix="bench-gateway-spool-")
    direct_port, gateway_port = _free_port(), _free_port()
    common = [sys.executable, "-m", "bench.gateway", "--output-tokens", str(args.output_tokens)]
    direct = subprocess.Popen([*common, "--serve", "direct", "--port", str(direct_port)])
    gateway = subprocess.Popen([*common, "--serve", "gateway", "--port", str(gateway_port), "--prefix-mode",
                                args.prefix_mode, *(["--no-fast-ascii"] if args.no_fast_ascii else []),
                                "--spool-dir", spool, "--calls-topic", calls_topic, "--env-topic", env_topic])
    direct_url, gateway_url = f"http://127.0.0.1:{direct_port}", f"http://127.0.0.1:{gateway_port}"
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    figures: dict[str, Any] = {}
    raw = RawClient()
    try:
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            post = _poster(args.client, client, raw)
            await _wait_healthy(client, direct_url, direct, "direct")
            await _wait_healthy(client, gateway_url, gateway, "gateway")
            n_rollouts = len(warmup) + len(timed) + len(c64)
            print(f"starting {n_rollouts} rollouts ...", flush=True)
            bases = await _start_rollouts(client, gateway_url, n_rollouts)
            chat = "/v1/chat/completions"
            gateway_urls = [gateway_url + base + chat for base in bases]
            direct_chat = direct_url + chat

            print(f"warm-up: {sum(len(c) for c in warmup)} calls each ...", flush=True)
            for n, conversation in enumerate(warmup):
                for body in conversation:
                    await _call(post, direct_chat, body)
                    await _call(post, gateway_urls[n], body)

            print(f"concurrency 1: {n_c1} calls each, alternating ...", flush=True)
            direct_s: list[float] = []
            gateway_s: list[float] = []
            cpu_before, direct_cpu_before = _cpu_seconds(gateway.pid), _cpu_seconds(direct.pid)
            sums_before = await _histogram_sums(client, gateway_url)
            i = 0
            for n, conversation in enumerate(timed, start=len(warmup)):
                for body in conversation:
                    if i % 2:
                        direct_s.append(await _call(post, direct_chat, body))
                        gateway_s.append(await _call(post, gateway_urls[n], body))
                    else:
                        gateway_s.append(await _call(post, gateway_urls[n], body))
                        direct_s.append(await _call(post, direct_chat, body))
                    i += 1
                    if i % max(1, n_c1 // 5) == 0:
                        print(f"  {i}/{n_c1}", flush=True)
            cpu_c1 = _cpu_seconds(gateway.pid) - cpu_before
            direct_cpu_c1 = _cpu_seconds(direct.pid) - direct_cpu_before
            sums_c1 = await _histogram_sums(client, gateway_url)

            print(f"concurrency 64: {n_c64} calls each ({len(c64)} conversations), gateway then direct ...",
                  flush=True)
            first = len(warmup) + len(timed)
            cpu_before = _cpu_seconds(gateway.pid)
            c64_latencies, c64_s = await _concurrently(
                post, [[(gateway_urls[first + k], b) for b in c] for k, c in enumerate(c64)], 64)
            cpu_c64 = _cpu_seconds(gateway.pid) - cpu_before
            _, direct_c64_s = await _concurrently(post, [[(direct_chat, b) for b in c] for c in c64], 64)

            health = (await client.get(f"{gateway_url}/health")).json()
        sink = health.get("sink", {})

        # Durable delivery included: every call's record is on the calls topic.
        consumer = Consumer(consumer_config(settings.kafka, f"bench-{tag}"))
        metadata = admin.list_topics(calls_topic, timeout=30).topics[calls_topic]
        on_kafka = sum(consumer.get_watermark_offsets(TopicPartition(calls_topic, p), timeout=30)[1]
                       for p in metadata.partitions)
        consumer.close()

        direct_p50, gateway_p50 = statistics.median(direct_s), statistics.median(gateway_s)
        paired = [g - d for g, d in zip(gateway_s, direct_s, strict=True)]
        figures = {
            "prompt_tokens": prompt_len,
            "direct_p50_ms_c1": direct_p50 * 1000,
            "gateway_p50_ms_c1": gateway_p50 * 1000,
            "direct_p99_ms_c1": _percentile(direct_s, 0.99) * 1000,
            "gateway_p99_ms_c1": _percentile(gateway_s, 0.99) * 1000,
            "added_p50_ms_c1": (gateway_p50 - direct_p50) * 1000,
            "added_p99_ms_c1": (_percentile(gateway_s, 0.99) - _percentile(direct_s, 0.99)) * 1000,
            "added_paired_p50_ms_c1": statistics.median(paired) * 1000,
            "cpu_ms_per_call": cpu_c1 / n_c1 * 1000,
            # The direct server on the same HTTP stack (uvicorn + Starlette, JSON in and out): a floor
            # under any gateway on this stack; the rest is the gateway's own work.
            "direct_cpu_ms_per_call": direct_cpu_c1 / n_c1 * 1000,
            "cpu_ratio_vs_direct": cpu_c1 / max(direct_cpu_c1, 1e-9),
            "render_cpu_ms_per_call": _mean_ms(sums_before, sums_c1, "tokentrail_gateway_render_seconds"),
            "delivery_wait_ms_c1": _mean_ms(sums_before, sums_c1, "tokentrail_gateway_delivery_seconds"),
            "cpu_ms_per_call_c64": cpu_c64 / n_c64 * 1000,
            "calls_per_s_c64": n_c64 / c64_s,
            "direct_calls_per_s_c64": n_c64 / direct_c64_s,
            "gateway_p50_ms_c64": statistics.median(c64_latencies) * 1000,
            "gateway_p99_ms_c64": _percentile(c64_latencies, 0.99) * 1000,
            "records_on_kafka": on_kafka,
            "gateway_calls": total,
            "workload": args.workload,
            "prefix_mode": args.prefix_mode,
            "fast_ascii_tokenize": not args.no_fast_ascii,
            "turns_per_conversation": turns,
            "group_size": args.group_size if args.workload == "agent" else 1,
            "spool_depth_at_end": sink.get("spool_depth", -1),
            "delivery_errors": sink.get("delivery_errors", -1),
        }
    finally:
        await raw.close()
        for proc in (direct, gateway):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (direct, gateway):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for future in admin.delete_topics([calls_topic, env_topic], operation_timeout=30).values():
            try:
                future.result(timeout=60)
            except Exception as exc:  # best effort: the figures matter more than the cleanup
                print(f"could not delete a bench topic: {exc}", file=sys.stderr)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway",
        description="Latency, CPU and throughput the gateway adds over a direct call to a model server, "
                    "with durable Kafka delivery of every call record.")
    parser.add_argument("--calls", type=int, default=400, help="timed calls per server at concurrency 1")
    parser.add_argument("--c64-calls", type=int, default=3000, help="gateway calls at concurrency 64")
    parser.add_argument("--warmup", type=int, default=50, help="untimed calls per server first")
    parser.add_argument("--prompt-tokens", type=int, default=4096, help="rendered prompt length")
    parser.add_argument("--output-tokens", type=int, default=16, help="sampled tokens per call")
    parser.add_argument("--workload", choices=["agent", "distinct", "same"], default="agent",
                        help="agent: multi-turn conversations, each call extending the previous one (default); "
                        "distinct: a new single-turn conversation per call; same: one conversation for all")
    parser.add_argument("--turns", type=int, default=8, help="calls per conversation in the agent workload")
    parser.add_argument("--group-size", type=int, default=1,
                        help="agent workload: conversations per group sharing their task prompt, as the rollouts "
                        "of a GRPO group do (default 1: every conversation differs from its first word)")
    parser.add_argument("--turn-tokens", type=int, default=128,
                        help="words of tool result added per turn in the agent workload")
    parser.add_argument("--prefix-mode", choices=["splice", "retokenize", "upstream"], default="splice",
                        help="the gateway's prefix mode (default splice; upstream: pass-through, the upstream "
                        "renders, here a model server that renders for free)")
    parser.add_argument("--no-fast-ascii", action="store_true",
                        help="tokenize with the tokenizer itself, not the exact ASCII fast path (for comparison)")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw",
                        help="HTTP client of the timed calls (raw: minimal keep-alive HTTP/1.1)")
    # Internal: run one of the two servers (the benchmark starts them as subprocesses).
    parser.add_argument("--serve", choices=["direct", "gateway"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--spool-dir", help=argparse.SUPPRESS)
    parser.add_argument("--calls-topic", help=argparse.SUPPRESS)
    parser.add_argument("--env-topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args)
    figures = asyncio.run(run_bench(args))
    if figures["records_on_kafka"] < figures["gateway_calls"]:
        print(f"WARNING: only {figures['records_on_kafka']} of {figures['gateway_calls']} call records "
              "are on Kafka", file=sys.stderr)
    emit(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
