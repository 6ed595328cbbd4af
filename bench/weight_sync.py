"""Weight sync on a real vLLM: from a published policy version to the first call sampled by it.

A vLLM server (CPU build, dev mode; started here from deploy/vllm/serve.sh unless --server is given)
serves the reference model behind the gateway's vLLM upstream, gated by the weight sync exactly as
the gateway composes them (``tokentrail.runtime.weight_sync.gate_upstream``). Worker tasks keep
calls running on a fixed prompt while the bench publishes ``--updates`` policy versions into a policy
store, one at a time, as the trainer does. For each version it measures the time from ``publish``
returning to the first call that started after it and came back recorded at that version, and takes
the time the server was paused from the sync's report.

Every call is checked, not assumed: its first sampled token's logprob must equal that token's logprob
under the weights of the version it was recorded with (a transformers forward pass over the same
prompt, temperature 1, so vLLM's processed logprobs are the model's). ``version_mismatches`` counts
calls where it does not.

    python -m bench.weight_sync [--updates 20] [--concurrency 3] [--server URL]

Settings: the flags, or BENCH_WEIGHT_SYNC_<FLAG> environment variables (e.g. BENCH_WEIGHT_SYNC_UPDATES).
Last line: one JSON object with sync_p50_s, sync_p99_s, paused_s_per_update, failed_requests, and more.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from pydantic_settings import BaseSettings, SettingsConfigDict

from bench.common import emit
from bench.processes import free_port
from models.policy_store import PolicyStore
from producers.upstreams.base import GenerateRequest, GenerateResult, Sampling
from producers.upstreams.vllm import VLLMUpstream
from producers.upstreams.weight_gate import GatedUpstream
from schemas.local_paths import REPO_ROOT
from tokentrail.runtime.weight_sync import gate_upstream

SERVE = REPO_ROOT / "deploy" / "vllm" / "serve.sh"
PROMPT = [5, 17, 33, 41, 12, 9, 100, 200, 7, 3]
LOGPROB_ATOL = 1e-3


class BenchSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BENCH_WEIGHT_SYNC_")

    updates: int = 20
    concurrency: int = 3
    max_tokens: int = 8
    gap_s: float = 0.5  # between one version being served and the next publish
    interval_s: float = 0.05  # how often the sync looks at the store
    server: str = ""  # a running dev-mode vLLM; empty: start one
    startup_timeout_s: float = 600.0


@dataclass
class Call:
    started: float
    ended: float
    version: int
    first_id: int
    first_logprob: float


def perturbed(base: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {k: t + torch.randn(t.shape, generator=generator) * (t.float().std() + 0.02) for k, t in base.items()}


def next_token_logprobs(model: Any, weights: dict[str, torch.Tensor]) -> np.ndarray:
    """log_softmax of the next-token logits after PROMPT under ``weights``."""
    model.load_state_dict(weights)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([PROMPT])).logits[0, -1].float()
    return torch.log_softmax(logits, dim=-1).numpy()


def start_server(model_dir: Path, name: str, timeout_s: float, port: int | None = None,
                 vllm_args: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = port or free_port()
    log = REPO_ROOT / "var" / "log" / f"bench-weight-sync-vllm-{port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = ["bash", str(SERVE), "--model", str(model_dir), "--name", name, "--port", str(port),
               "--logprobs-mode", "processed_logprobs", "--quick-start", *(["--", *vllm_args] if vllm_args else [])]
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"})
    url = f"http://127.0.0.1:{port}"
    began = time.monotonic()
    while True:
        if process.poll() is not None:
            raise SystemExit(f"vLLM exited with {process.returncode} while starting; see {log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() - began > timeout_s:
            stop_server(process)
            raise SystemExit(f"vLLM did not start within {timeout_s:.0f} s; see {log}")
        waited = time.monotonic() - began
        if int(waited) // 15 != int(waited - 2) // 15:  # a line every 15 s, readable in a log too
            print(f"  waiting for vLLM ({waited:.0f} s) ...", flush=True)
        time.sleep(2)
    print(f"  vLLM ready at {url} in {time.monotonic() - began:.0f} s (log {log})")
    return process, url, log


def stop_server(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        pgid = os.getpgid(process.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            process.wait(timeout=30)


async def final_result(upstream: GatedUpstream, request: GenerateRequest, whole: bool) -> GenerateResult:
    """The call's final result, streamed or (``whole``) asked for in one answer."""
    stream = upstream.generate_stream(request)
    if whole:
        stream.prefer_whole()
    result: GenerateResult | None = None
    try:
        async for item in stream:
            if isinstance(item, GenerateResult):
                result = item
    finally:
        await stream.aclose()
    assert result is not None, "no result"
    return result


async def call_once(upstream: GatedUpstream, max_tokens: int, whole: bool) -> Call:
    request = GenerateRequest(prompt_ids=PROMPT, sampling=Sampling(temperature=1.0, max_tokens=max_tokens),
                              request_id=uuid.uuid4().hex, rollout_id=uuid.uuid4().hex)
    started = time.monotonic()
    result = await final_result(upstream, request, whole)
    assert result.output_ids, "no result"
    return Call(started, time.monotonic(), result.policy_version, result.output_ids[0], result.output_logprobs[0])


async def run(settings: BenchSettings, url: str, model_dir: Path, name: str) -> dict[str, Any]:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = load_file(str(model_dir / "model.safetensors"))
    reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    weights = {v: perturbed(base, seed=v) for v in range(1, settings.updates + 1)}
    expected = {0: next_token_logprobs(reference, base)} | {v: next_token_logprobs(reference, w)
                                                             for v, w in weights.items()}
    store = PolicyStore(Path(tempfile.mkdtemp(prefix="bench-weight-sync-")))
    upstream = gate_upstream(VLLMUpstream([url], model=name, logprobs_mode="processed_logprobs"), store,
                             base_dir=model_dir, interval_s=settings.interval_s)
    assert upstream.sync is not None
    sync = upstream.sync
    upstream.follow_policies(store)
    calls: list[Call] = []
    failures: list[str] = []
    stop = asyncio.Event()

    async def worker(index: int) -> None:
        whole = index % 2 == 0  # half the calls streamed, half whole, as the gateway asks
        while not stop.is_set():
            try:
                calls.append(await call_once(upstream, settings.max_tokens, whole))
            except Exception as exc:  # a failed request is a figure, not the end of the bench
                failures.append(f"{type(exc).__name__}: {exc}")

    async def served_at(version: int, after: float, timeout_s: float = 300.0) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = [c.ended for c in calls if c.version == version and c.started >= after]
            if done:
                return min(done)
            await asyncio.sleep(0.005)
        raise SystemExit(f"no call served at version {version} within {timeout_s:.0f} s")

    workers = [asyncio.create_task(worker(i)) for i in range(settings.concurrency)]
    latencies: list[float] = []
    try:
        await served_at(0, 0.0)
        for version in range(1, settings.updates + 1):
            await asyncio.sleep(settings.gap_s)
            await asyncio.to_thread(store.publish, version, weights[version])
            published = time.monotonic()
            first = await served_at(version, published)
            latencies.append(first - published)
            report = sync.reports[-1]
            print(f"  v{version:<3} first call at the new version {latencies[-1]:.3f} s after publish; "
                  f"sync {report.total_s:.3f} s, paused {max(report.paused_s.values()):.3f} s; "
                  f"{len(calls)} calls, {len(failures)} failed", flush=True)
    finally:
        stop.set()
        await asyncio.gather(*workers)
        await upstream.close()
    async with httpx.AsyncClient() as client:
        label = (await client.get(url + "/weight_info", timeout=30)).json()["weight_version"]

    # vLLM's recorded logprob against the trainer's (transformers) for the version each call recorded.
    gaps = np.array([abs(float(expected[c.version][c.first_id]) - c.first_logprob) for c in calls])
    mismatches = int(np.sum(gaps > LOGPROB_ATOL))
    reports = [r for r in sync.reports if r.version >= 1]
    paused = [max(r.paused_s.values()) for r in reports]
    return {
        "updates": len(latencies),
        "sync_p50_s": float(np.percentile(latencies, 50)),
        "sync_p99_s": float(np.percentile(latencies, 99)),
        "sync_max_s": float(max(latencies)),
        "sync_report_mean_s": float(np.mean([r.total_s for r in reports])),
        "paused_s_per_update": float(np.mean(paused)),
        "paused_max_s": float(max(paused)),
        "calls": len(calls),
        "failed_requests": len(failures),
        "failed_updates": sum(not r.ok for r in reports),
        "version_mismatches": mismatches,
        "engine_trainer_logprob_mean_abs_diff": float(gaps.mean()) if len(gaps) else 0.0,
        "engine_trainer_logprob_max_abs_diff": float(gaps.max()) if len(gaps) else 0.0,
        "versions_served": len({c.version for c in calls}),
        "final_weight_label": label,
        "first_failure": failures[0] if failures else "",
    }


def main(argv: list[str] | None = None) -> int:
    defaults = BenchSettings()
    parser = argparse.ArgumentParser(prog="python -m bench.weight_sync", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=defaults.updates, help="policy versions to publish")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency, help="calls kept running")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="tokens per call")
    parser.add_argument("--gap", type=float, default=defaults.gap_s, help="seconds between updates")
    parser.add_argument("--interval", type=float, default=defaults.interval_s,
                        help="seconds between the sync's looks at the store")
    parser.add_argument("--server", default=defaults.server,
                        help="a running vLLM started with VLLM_SERVER_DEV_MODE=1 (default: start one)")
    args = parser.parse_args(argv)
    settings = BenchSettings(updates=args.updates, concurrency=args.concurrency, max_tokens=args.max_tokens,
                             gap_s=args.gap, interval_s=args.interval, server=args.server)
    from models.reference.build import build_model
    from tokentrail.settings import get_settings

    model_settings = get_settings().model
    model_dir = build_model(model_settings.dir)
    process = None
    url = settings.server
    if not url:
        print(f"starting vLLM on {model_dir} (dev mode, --quick-start) ...", flush=True)
        process, url, _ = start_server(model_dir, model_settings.name, settings.startup_timeout_s)
    try:
        figures = asyncio.run(run(settings, url, model_dir, model_settings.name))
    finally:
        if process is not None:
            stop_server(process)
    emit(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
