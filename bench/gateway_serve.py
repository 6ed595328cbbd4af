"""The gateway side of bench.gateway: the gateway process it starts (``python -m bench.gateway --serve``),
over HTTP to the benchmark's vLLM-speaking upstream or with an in-process upstream that samples nothing,
as one process or several behind one port, optionally tracing its allocations."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.gateway_workload import MODEL, output_ids_of, prompt_of_tokens, text_side
from bench.processes import free_port
from producers.upstreams.base import ChatGenerateRequest, GenerateRequest, GenerateResult, TokenChunk


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
    text = text_side(fast_ascii)
    upstream = None
    if not upstream_url:
        sample = text.render_text([{"role": "user", "content": prompt_of_tokens(text, 512)}], None)
        chars_per_token = len(sample) / len(text.encode_text(sample))
        upstream = FastUpstream(output_ids_of(text, output_tokens), text.vocab_size, chars_per_token)
    return build_app(
        settings, upstream=upstream, publisher=CallPublisher.from_settings(settings.kafka, settings.gateway),
        text=text, topics={"calls_topic": calls_topic, "env_topic": env_topic}, progress=lambda _: None,
    )


def install_sealing(keys_topic: str) -> None:
    """Seal every subject's content in this gateway process (issue 31), keys on ``keys_topic``."""
    from tokentrail.forgetting import install
    from tokentrail.settings import get_settings

    settings = get_settings()
    forget = settings.forget.model_copy(update={"enabled": True, "keys_topic": keys_topic})
    install(settings.model_copy(update={"forget": forget}))


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    if args.seal_keys_topic:
        install_sealing(args.seal_keys_topic)

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
