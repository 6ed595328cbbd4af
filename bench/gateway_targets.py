"""bench.gateway's servers: the upstream (**direct**) and the fronts compared in front of it (gateway, sealed
gateway, thin proxy, LiteLLM, the multi-process and in-process gateways), started as processes of their own,
and the rollouts a gateway's conversations run in."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import litellm_proxy
from bench.gateway_workload import CHAT, MODEL
from bench.processes import free_port


async def start_rollouts(client: httpx.AsyncClient, url: str, count: int, subjects: bool = False) -> list[str]:
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
        bases = await start_rollouts(client, self.url, conversations, self.subjects)
        return [self.url + base + CHAT for base in bases]


def check_alive(targets: dict[str, Target]) -> None:
    for target in targets.values():
        if target.proc.poll() is not None:
            raise RuntimeError(f"the {target.name} server exited ({target.proc.returncode})")



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


def start_servers(args: argparse.Namespace, servers: Servers, text: Any, output_ids: list[int],
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
