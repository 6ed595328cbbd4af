"""bench.gateway's memory run (``python -m bench.gateway --memory``): the gateway's RSS on the real path
after a checkpoint and after tens of thousands of distinct calls."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.gateway_workload import (
    CHAT,
    MODEL,
    bench_topics,
    memory_conversations,
    output_ids_of,
    prompt_of_tokens,
    text_side,
)
from bench.http_client import RawClient
from bench.processes import free_port, rss_mib, stop, wait_healthy


async def run_memory(args: argparse.Namespace) -> dict[str, Any]:
    """RSS of the gateway (real path, splice by default) after ``--memory-checkpoint`` and after
    ``--memory-calls`` distinct requests: conversations of ``--turns`` calls on a small first message,
    each in a rollout started before and finished after (as an environment does), ``--memory-concurrency``
    at a time. Figures: the RSS at each checkpoint and the growth fraction between the first and the end,
    with what the byte-bounded parts hold (/health: the text side's caches, the attempt registry)."""
    from tokentrail.settings import get_settings

    tag = uuid.uuid4().hex[:8]
    calls_topic, env_topic = f"bench.gateway.mem-calls.{tag}", f"bench.gateway.mem-env.{tag}"
    with bench_topics(get_settings().kafka, calls_topic, env_topic):
        return await _memory_run(args, calls_topic, env_topic)


async def _memory_run(args: argparse.Namespace, calls_topic: str, env_topic: str) -> dict[str, Any]:
    text = text_side()
    first = prompt_of_tokens(text, args.memory_prompt_tokens)
    output_ids = output_ids_of(text, args.output_tokens)
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
            conversations = memory_conversations(-(-total // args.turns), args.turns, first, answer,
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
