"""An in-flight weight update on the real vLLM, through the gateway's gated upstream as the shell composes it
(``gate_upstream``, pause mode ``keep``, delta transfer): a long call running when a version is published is
not waited for. The update lands while the call runs, the call completes, and vLLM's spans say which of its
tokens each version sampled: (old, 0, k), (new, k, n). The new version reaches the server as a delta (one
transformer layer), not the full checkpoint.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from bench.weight_sync import LongCalls, perturbed
from models.policy_store import PolicyStore
from producers.upstreams.base import GenerateRequest, GenerateResult, Sampling, TokenChunk
from tokentrail.runtime.weight_sync import gate_upstream

from .test_weight_sync_live import restore_base
from .vllm_server import VLLMServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

PROMPT = [5, 17, 33, 41, 12, 9, 100, 200]
TOKENS = 1500  # long enough that the update lands mid-call even on a loaded CI machine


def test_a_long_call_runs_across_a_keep_update_and_records_both_versions(
    vllm_server: VLLMServer, live_model_dir: Path, tmp_path: Path,
) -> None:
    store = PolicyStore(tmp_path / "policies")
    base = load_file(str(live_model_dir / "model.safetensors"))
    v1 = perturbed(base, seed=11)
    v2 = perturbed(v1, seed=12, group="model.layers.1")  # one layer changes: a delta

    async def run() -> tuple[GenerateResult, float, float, Any]:
        upstream = gate_upstream(
            LongCalls([vllm_server.url], model=vllm_server.model_name, logprobs_mode=vllm_server.logprobs_mode,
                      token_endpoint="generate"),
            store, base_dir=live_model_dir, interval_s=0.05, pause_mode="keep", transfer="delta")
        sync = upstream.sync
        assert sync is not None and upstream.in_flight_updates
        upstream.follow_policies(store)
        try:
            store.publish(1, v1)
            while not any(r.version == 1 and r.ok for r in sync.reports):
                await asyncio.sleep(0.05)
            tokens = 0
            published = 0.0

            async for item in upstream.generate_stream(GenerateRequest(
                    prompt_ids=PROMPT, request_id="in-flight", rollout_id="in-flight",
                    sampling=Sampling(max_tokens=TOKENS, temperature=0.0))):
                if isinstance(item, TokenChunk):
                    tokens += len(item.ids)
                    if tokens >= 8 and not published:  # well under way: publish the next version now
                        await asyncio.to_thread(store.publish, 2, v2, None, True)
                        published = time.monotonic()
                else:
                    ended = time.monotonic()
                    report = next(r for r in sync.reports if r.version == 2)
                    return item, published, ended, report
            raise AssertionError("the stream ended without a result")
        finally:
            await upstream.close()

    try:
        result, published, ended, report = asyncio.run(asyncio.wait_for(run(), 900))
        assert published > 0
        assert report.ok, report.failed
        assert list(report.loads.values()) == ["delta"], report.loads  # only the changed layer moved
        assert 0 < sum(report.bytes_moved.values()) < store.info(2).weights_path.stat().st_size
        assert len(result.output_ids) == TOKENS  # the call completed
        spans = [(s.version, s.start, s.end) for s in result.version_spans]
        assert len(spans) == 2 and spans[0][:2] == (1, 0) and spans[1][0] == 2, spans
        k = spans[0][2]
        assert 8 <= k < TOKENS and spans[1][1:] == (k, TOKENS), spans
        assert result.policy_version == 1  # the record's version is its first (oldest) token's
        # The update did not wait for the call: the sync's report (its resume) came before the call ended,
        # by the time the call's remaining tokens took.
        assert report.total_s < ended - published, (report.total_s, ended - published)
    finally:
        restore_base(vllm_server, live_model_dir, store)
