"""Weight sync on a real vLLM: from a published policy version to the first call sampled by it.

A vLLM server (CPU build, dev mode; started here from deploy/vllm/serve.sh unless --server is given)
serves the reference model behind the gateway's vLLM upstream, gated by the weight sync exactly as
the gateway composes them (``tokentrail.runtime.weight_sync.gate_upstream``). Worker tasks keep
calls running on a fixed prompt while the bench publishes ``--updates`` policy versions into a policy
store, one at a time, as the trainer does (each version changes one transformer layer of the one before,
published with its delta). For each version it measures the time from ``publish`` returning to the first
token sampled by that version reaching a caller (vLLM's per-token ``weight_versions`` spans say which
tokens each version sampled; a streamed token's arrival is timed, a whole answer's tokens arrive at its
end), and takes the time the server was paused and the bytes its loader read from the sync's report.

``--mode keep|wait`` (pause mode: ``keep`` updates in flight, ``wait`` lets running calls finish first)
and ``--transfer scatter|elements|delta|full`` (only the changed elements, written into the parameters in place by
the server's workers; only the changed elements, reconstructed by the sync from its copy of the weights the server
holds and loaded as the changed groups; only the changed weight groups; or the full checkpoint).
``--change-share F`` (0 < F < 1): each version moves that share of the elements of every tensor instead of one
whole layer, as a small optimizer step does in bf16 (``python -m bench.delta_fraction`` measures 1.4-2.7%).

Every call is checked, not assumed: its first sampled token's logprob must equal that token's logprob
under the weights of the version it was recorded with (a transformers forward pass over the same
prompt, temperature 1, so vLLM's processed logprobs are the model's). ``version_mismatches`` counts
calls where it does not.

    python -m bench.weight_sync [--updates 20] [--concurrency 3] [--call-tokens 8] [--server URL]

``--call-tokens N``: every call samples exactly N tokens (``ignore_eos``: the reference model would end
most answers within about 30), so the bench shows how an update's latency depends on the length of the
calls running when it lands. The server's ``--max-model-len`` must hold the prompt plus N.

Settings: the flags, or BENCH_WEIGHT_SYNC_<FLAG> environment variables (e.g. BENCH_WEIGHT_SYNC_UPDATES).
Last line: one JSON object with publish_to_served_p50_s / _p99_s, paused_s_per_update, bytes_per_update,
full_checkpoint_bytes, failed_requests, version_mismatches, and more.
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
from typing import Any, Literal

import httpx
import numpy as np
import torch
from pydantic_settings import BaseSettings, SettingsConfigDict

from bench.common import emit
from bench.processes import free_port
from models.policy_delta import weight_group
from models.policy_store import PolicyStore
from producers.upstreams.base import GenerateRequest, GenerateResult, Sampling
from producers.upstreams.vllm import VLLMUpstream, label_version, spans_from_text
from producers.upstreams.weight_gate import GatedUpstream
from schemas.local_paths import REPO_ROOT
from tokentrail.runtime.weight_sync import gate_upstream

SERVE = REPO_ROOT / "deploy" / "vllm" / "serve.sh"
PROMPT = [5, 17, 33, 41, 12, 9, 100, 200, 7, 3]
LOGPROB_ATOL = 1e-3


class LongCalls(VLLMUpstream):
    """Calls that sample exactly ``max_tokens`` tokens: ``ignore_eos`` in either endpoint's body (the
    reference model ends most answers with EOS within about 30 tokens)."""

    async def token_body(self, request: GenerateRequest, stream: bool) -> tuple[dict[str, Any], bytes]:
        body, sent = await super().token_body(request, stream)
        body.get("sampling_params", body)["ignore_eos"] = True
        return body, sent


class BenchSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BENCH_WEIGHT_SYNC_")

    updates: int = 20
    concurrency: int = 3
    call_tokens: int = 8  # output tokens per call, exactly (ignore_eos)
    mode: Literal["keep", "wait"] = "keep"  # the sync's pause mode
    # >0: one more caller making short streamed calls of this many tokens beside the long ones; the first token
    # of a version is then known without waiting for the long calls to end
    probe_tokens: int = 0
    drain_s: float = 900.0  # at the end, how long running calls may take to finish before they are cut
    transfer: Literal["scatter", "elements", "delta", "full"] = "delta"
    change_share: float = 0.0  # >0: each version moves this share of every tensor's elements (else one layer)
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
    token_times: list[float]  # when each output token reached the caller
    spans: list[tuple[int | None, int, int]]  # vLLM's (version, start, end) over the output tokens

    def first_token_at(self, version: int) -> float | None:
        """When the first token ``version`` sampled reached the caller (None: it sampled none here)."""
        starts = [start for v, start, end in self.spans if v == version and end > start]
        return self.token_times[min(starts)] if starts else None


def perturbed(base: dict[str, torch.Tensor], seed: int, group: str | None = None) -> dict[str, torch.Tensor]:
    """``base`` with noise added to every tensor, or (``group``) to those of one weight group only."""
    generator = torch.Generator().manual_seed(seed)
    return {k: t + torch.randn(t.shape, generator=generator) * (t.float().std() + 0.02)
            if group is None or weight_group(k) == group else t for k, t in base.items()}


def version_chain(base: dict[str, torch.Tensor], updates: int) -> dict[int, dict[str, torch.Tensor]]:
    """Versions 1..updates, each changing one transformer layer of the one before (in turn), as a partial
    update would: what a delta can move without the rest."""
    layers = sorted({weight_group(k) for k in base if ".layers." in k})
    chain, weights = {}, base
    for version in range(1, updates + 1):
        weights = perturbed(weights, seed=version, group=layers[version % len(layers)])
        chain[version] = weights
    return chain


def sparse_chain(base: dict[str, torch.Tensor], updates: int, share: float) -> dict[int, dict[str, torch.Tensor]]:
    """Versions 1..updates, each moving ``share`` of the elements of every tensor of the one before (by about
    the tensor's spread): every weight group changes, few elements do, as in a small step in bf16."""
    chain, weights = {}, base
    for version in range(1, updates + 1):
        generator = torch.Generator().manual_seed(version)
        weights = {k: torch.where(torch.rand(t.shape, generator=generator) < share,
                                  t + torch.randn(t.shape, generator=generator) * (t.float().std() + 0.02), t)
                   for k, t in weights.items()}
        chain[version] = weights
    return chain


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
    return (await timed_result(upstream, request, whole))[0]


async def timed_result(upstream: GatedUpstream, request: GenerateRequest,
                       whole: bool) -> tuple[GenerateResult, list[float]]:
    """The call's final result, streamed or (``whole``) asked for in one answer, and when each output token
    reached the caller."""
    stream = upstream.generate_stream(request)
    if whole:
        stream.prefer_whole()
    result: GenerateResult | None = None
    times: list[float] = []
    try:
        async for item in stream:
            if isinstance(item, GenerateResult):
                result = item
            else:
                times.extend([time.monotonic()] * len(item.ids))
    finally:
        await stream.aclose()
    assert result is not None, "no result"
    ended = time.monotonic()
    return result, times + [ended] * (len(result.output_ids) - len(times))


async def call_once(upstream: GatedUpstream, max_tokens: int, whole: bool) -> Call:
    request = GenerateRequest(prompt_ids=PROMPT, sampling=Sampling(temperature=1.0, max_tokens=max_tokens),
                              request_id=uuid.uuid4().hex, rollout_id=uuid.uuid4().hex)
    started = time.monotonic()
    result, times = await timed_result(upstream, request, whole)
    assert result.output_ids, "no result"
    reported = result.extra.get("weight_versions")
    spans = ([(label_version(s.version), s.start, s.end) for s in spans_from_text(reported)]
             if isinstance(reported, str) else [(result.policy_version, 0, len(result.output_ids))])
    return Call(started, time.monotonic(), result.policy_version, result.output_ids[0], result.output_logprobs[0],
                times, spans)


async def run(settings: BenchSettings, url: str, model_dir: Path, name: str) -> dict[str, Any]:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = load_file(str(model_dir / "model.safetensors"))
    reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    weights = (sparse_chain(base, settings.updates, settings.change_share) if settings.change_share > 0
               else version_chain(base, settings.updates))
    expected = {0: next_token_logprobs(reference, base)} | {v: next_token_logprobs(reference, w)
                                                             for v, w in weights.items()}
    store = PolicyStore(Path(tempfile.mkdtemp(prefix="bench-weight-sync-")))
    upstream = gate_upstream(LongCalls([url], model=name, logprobs_mode="processed_logprobs",
                                       token_endpoint="generate"), store, base_dir=model_dir,
                             interval_s=settings.interval_s, pause_mode=settings.mode, transfer=settings.transfer)
    assert upstream.sync is not None
    sync = upstream.sync
    upstream.follow_policies(store)
    calls: list[Call] = []
    live: list[Call] = []  # calls under way: (started) placeholders
    failures: list[str] = []
    stop = asyncio.Event()

    async def worker(index: int, tokens: int, whole: bool) -> None:
        while not stop.is_set():
            marker = Call(time.monotonic(), 0.0, -1 if tokens == settings.call_tokens else -2, -1, 0.0, [], [])
            live.append(marker)
            try:
                calls.append(await call_once(upstream, tokens, whole))
            except Exception as exc:  # a failed request is a figure, not the end of the bench
                failures.append(f"{type(exc).__name__}: {exc}")
            finally:
                live.remove(marker)

    async def served_at(version: int, timeout_s: float = 900.0) -> float:
        """When the first token sampled by ``version`` reached a caller; known once a call that has one
        ended, and final once every call running at that moment has ended too (one of them may hold an
        earlier one). With probe calls the long calls still running are not waited for: the figure is then
        an upper bound (a long call may have had a token of the version a little earlier)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            firsts = [t for c in calls if (t := c.first_token_at(version)) is not None]
            waited = [c for c in live if c.started <= min(firsts, default=0.0)
                      and not (settings.probe_tokens and c.version == -1)]
            if firsts and not waited:
                return min(firsts)
            await asyncio.sleep(0.01)
        raise SystemExit(f"no token sampled by version {version} reached a caller within {timeout_s:.0f} s")

    # half the calls streamed (the first worker's: its tokens are timed), half whole; probes always streamed
    workers = [asyncio.create_task(worker(i, settings.call_tokens, i % 2 == 1)) for i in range(settings.concurrency)]
    if settings.probe_tokens:
        workers.append(asyncio.create_task(worker(-1, settings.probe_tokens, False)))
    latencies: list[float] = []
    try:
        await served_at(0)
        for version in range(1, settings.updates + 1):
            await asyncio.sleep(settings.gap_s)
            await asyncio.to_thread(store.publish, version, weights[version], None, settings.transfer != "full")
            published = time.monotonic()
            first = await served_at(version)
            latencies.append(first - published)
            report = next(r for r in sync.reports if r.version == version)
            print(f"  v{version:<3} first token of the new version {latencies[-1]:.3f} s after publish; "
                  f"sync {report.total_s:.3f} s, paused {max(report.paused_s.values()):.3f} s, "
                  f"{'/'.join(report.loads.values())} {sum(report.bytes_moved.values())} B; "
                  f"{len(calls)} calls, {len(failures)} failed", flush=True)
    finally:
        stop.set()
        # calls still running after drain_s are cut (not failures: counted apart); a long call's completion
        # across in-flight updates is what tests/.../test_in_flight_update_live.py proves
        _, pending = await asyncio.wait(workers, timeout=settings.drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await upstream.close()
    async with httpx.AsyncClient() as client:
        label = (await client.get(url + "/weight_info", timeout=30)).json()["weight_version"]

    # vLLM's recorded logprob against the trainer's (transformers) for the version each call recorded.
    gaps = np.array([abs(float(expected[c.version][c.first_id]) - c.first_logprob) for c in calls])
    mismatches = int(np.sum(gaps > LOGPROB_ATOL)) + upstream.checks["mismatched"]
    reports = [r for r in sync.reports if r.version >= 1]
    paused = [max(r.paused_s.values()) for r in reports]
    moved = [sum(r.bytes_moved.values()) for r in reports]
    full_bytes = store.info(settings.updates).weights_path.stat().st_size
    return {
        "updates": len(latencies),
        "call_tokens": settings.call_tokens,
        "mode": settings.mode,
        "transfer": settings.transfer,
        "change_share": settings.change_share,
        "publish_to_served_p50_s": float(np.percentile(latencies, 50)),
        "publish_to_served_p99_s": float(np.percentile(latencies, 99)),
        "publish_to_served_max_s": float(max(latencies)),
        "bytes_per_update": float(np.mean(moved)),
        "full_checkpoint_bytes": full_bytes,
        "bytes_fraction": float(np.mean(moved)) / full_bytes,
        "loads": sorted({load for r in reports for load in r.loads.values()}),
        # what vLLM's loader read from the sync's reconstruction (element deltas), per update
        "bytes_reloaded_per_update": float(np.mean([sum(r.bytes_reloaded.values()) for r in reports])),
        "calls_spanning_versions": sum(len({v for v, _, _ in c.spans}) > 1 for c in calls),
        "probe_tokens": settings.probe_tokens,
        "calls_cut_at_end": len(pending),
        "long_calls_completed": sum(len(c.token_times) == settings.call_tokens for c in calls),
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
    parser.add_argument("--call-tokens", "--max-tokens", type=int, default=defaults.call_tokens,
                        help="output tokens per call, exactly (ignore_eos); e.g. 8, 512, 4096")
    parser.add_argument("--mode", choices=["keep", "wait"], default=defaults.mode,
                        help="pause mode: keep (update in flight) or wait (running calls finish first)")
    parser.add_argument("--transfer", choices=["scatter", "elements", "delta", "full"], default=defaults.transfer,
                        help="only the changed elements written in place by the server's workers, only the changed "
                             "elements (reconstructed by the sync), the published delta (changed weight groups), "
                             "or the full checkpoint")
    parser.add_argument("--change-share", type=float, default=defaults.change_share,
                        help="each version moves this share of every tensor's elements (0: one whole layer)")
    parser.add_argument("--probe-tokens", type=int, default=defaults.probe_tokens,
                        help="one more caller with short streamed calls of this many tokens (0: none)")
    parser.add_argument("--drain", type=float, default=defaults.drain_s,
                        help="seconds running calls may take to finish at the end before they are cut")
    parser.add_argument("--gap", type=float, default=defaults.gap_s, help="seconds between updates")
    parser.add_argument("--interval", type=float, default=defaults.interval_s,
                        help="seconds between the sync's looks at the store")
    parser.add_argument("--server", default=defaults.server,
                        help="a running vLLM started with VLLM_SERVER_DEV_MODE=1 (default: start one)")
    args = parser.parse_args(argv)
    settings = BenchSettings(updates=args.updates, concurrency=args.concurrency, call_tokens=args.call_tokens,
                             mode=args.mode, transfer=args.transfer, probe_tokens=args.probe_tokens,
                             change_share=args.change_share,
                             drain_s=args.drain,
                             gap_s=args.gap, interval_s=args.interval, server=args.server)
    from models.reference.build import build_model
    from tokentrail.settings import get_settings

    model_settings = get_settings().model
    model_dir = build_model(model_settings.dir)
    process = None
    url = settings.server
    if not url:
        print(f"starting vLLM on {model_dir} (dev mode, --quick-start) ...", flush=True)
        process, url, _ = start_server(model_dir, model_settings.name, settings.startup_timeout_s, vllm_args=(
            "--enable-scale-out", "--max-model-len", str(max(2048, len(PROMPT) + settings.call_tokens + 16))))
    try:
        figures = asyncio.run(run(settings, url, model_dir, model_settings.name))
    finally:
        if process is not None:
            stop_server(process)
    emit(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
