"""The gateway's upstream gated by the weight sync: a call records the version it leased, and an update
waits for running calls and holds new ones. The inner upstream is a stand-in (the test is about the
wrapper); tests/producers/upstreams/vllm_live/test_weight_sync_live.py runs it on a real vLLM."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from producers.upstreams.base import GenerateRequest, GenerateResult, Sampling, TokenChunk
from producers.upstreams.vllm import VLLMUpstream
from producers.upstreams.weight_gate import GatedUpstream
from trainer_consumer.weight_sync import VersionGate


class SlowUpstream:
    """Yields one token, waits for ``release``, then the result (stamped with a version it does not know)."""

    name = "stand-in"

    def __init__(self) -> None:
        self.release = asyncio.Event()

    def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        async def items() -> AsyncIterator[TokenChunk | GenerateResult]:
            yield TokenChunk([7], [-0.5])
            await self.release.wait()
            yield GenerateResult(prompt_ids=[1], output_ids=[7], output_logprobs=[-0.5], finish_reason="stop",
                                 logprob_kind="PROCESSED", policy_version=-1, engine="x", upstream="x")

        return items()


async def collect(stream: Any) -> GenerateResult:
    try:
        async for item in stream:
            if isinstance(item, GenerateResult):
                return item
    finally:
        await stream.aclose()
    raise AssertionError("no result")


def test_calls_record_the_leased_version_and_updates_wait_for_them() -> None:
    async def scenario() -> tuple[int, int, bool]:
        inner = SlowUpstream()
        gate = VersionGate(3)
        upstream = GatedUpstream(cast(VLLMUpstream, inner), gate)
        request = GenerateRequest(prompt_ids=[1], sampling=Sampling(), request_id="r")
        running = asyncio.create_task(collect(upstream.generate_stream(request)))
        await asyncio.sleep(0.01)
        update = asyncio.create_task(gate.close())
        await asyncio.sleep(0.01)
        waited = not update.done()  # the running call holds the update back
        inner.release.set()
        first = await running
        await update
        await gate.reopen(4)
        second = await collect(upstream.generate_stream(request))
        return first.policy_version, second.policy_version, waited

    assert asyncio.run(scenario()) == (3, 4, True)


class ReportingUpstream:
    """Answers whole, with the version and spans vLLM's /inference/v1/generate would report."""

    name = "stand-in"

    def __init__(self, spans: str, version: int) -> None:
        self.spans, self.version = spans, version

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return GenerateResult(prompt_ids=[1], output_ids=[7, 8], output_logprobs=[-0.5, -0.1], finish_reason="stop",
                              logprob_kind="PROCESSED", policy_version=self.version, engine="x", upstream="x",
                              extra={"weight_versions": self.spans})


def test_vllms_report_is_recorded_and_checked_against_the_lease() -> None:
    async def one(spans: str, version: int) -> tuple[GenerateResult, dict[str, int]]:
        upstream = GatedUpstream(cast(VLLMUpstream, ReportingUpstream(spans, version)), VersionGate(3))
        result = await upstream.generate(GenerateRequest(prompt_ids=[1], sampling=Sampling(), request_id="r"))
        return result, upstream.checks

    agreed, checks = asyncio.run(one("3:0-2", 3))
    assert (agreed.policy_version, agreed.extra["gate_version"], checks["mismatched"]) == (3, 3, 0)
    disagreed, checks = asyncio.run(one("2:0-2", 2))  # vLLM sampled with 2 while the lease says 3
    assert (disagreed.policy_version, disagreed.extra["gate_version"], checks["mismatched"]) == (2, 3, 1)
    spanning, checks = asyncio.run(one("3:0-1,4:1-2", 3))
    assert (spanning.policy_version, checks["spanning"], checks["mismatched"]) == (3, 1, 1)
    foreign, checks = asyncio.run(one("incomplete-4:0-2", 0))  # half-loaded weights name no version
    assert (foreign.policy_version, checks["mismatched"]) == (3, 1)
