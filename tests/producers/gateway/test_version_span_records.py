"""The gateway records what its upstream says about versions and release: a result whose tokens span a weight
update (as vLLM's ``weight_versions`` report it) becomes the record's typed ``version_spans``, a one-version
result records none, and the release arm a call was routed on becomes the record's ``release``. The engine is
the real embedded one; only its version report is added (the embedded engine never spans an update; vLLM's
spans are read by tests/producers/upstreams/vllm_live/test_engine_versions_live.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from producers.sdk import Rollout
from producers.upstreams.base import GenerateRequest, GenerateResult, ReleaseAssignment, TokenChunk
from producers.upstreams.embedded.engine import EmbeddedEngine
from schemas.version_spans import PolicySpan
from tokentrail.settings import Settings

from .helpers import output_of, read_records

MODEL = "tokentrail-tiny"
RELEASE = ReleaseAssignment("rel-9", 12, "pinned", pin_label="eval")


class ReportingEngine:
    """The real embedded engine, whose final results report an update after the first two tokens (the
    request whose max_tokens is 8) and the release arm they were routed on."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine, self.name, self.logprob_kind = engine, engine.name, engine.logprob_kind

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        async for item in self.engine.generate_stream(request):
            if isinstance(item, GenerateResult):
                n = len(item.output_ids)
                item.policy_version, item.release = 5, RELEASE
                if request.sampling.max_tokens == 8 and n > 2:
                    item.version_spans = (PolicySpan(5, 0, 2), PolicySpan(6, 2, n))
            yield item

    async def policy_version(self) -> int:
        return 5

    async def close(self) -> None:
        await self.engine.close()


def test_spans_and_release_arm_of_a_result_are_recorded(
    start_gateway: Any, topics: dict[str, str], model_dir: Any, tokentrail_settings: Settings,
) -> None:
    engine = ReportingEngine(EmbeddedEngine(model_dir))
    with start_gateway(upstream=engine) as gw, Rollout(gw.url) as rollout:
        client = rollout.openai_client()
        messages = [{"role": "user", "content": "hi"}]
        for max_tokens in (8, 4):  # seeded: the same answers every run
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, seed=3,
                                           stream=max_tokens == 8)
        calls = [r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 2,
                                            where={"rollout_id": rollout.rollout_id})]
    spanning, single = sorted(calls, key=lambda c: c["call_index"])
    n = len(output_of(spanning)[0])
    assert n > 2, "the tiny model answered in two tokens: no update could land inside"
    assert spanning["versions"]["policy_version"] == 5
    assert spanning["version_spans"] == [{"version": 5, "start": 0, "end": 2}, {"version": 6, "start": 2, "end": n}]
    assert single["version_spans"] == []  # one version: the record's policy_version says it all
    for call in calls:
        assert call["release"] == {"release_id": "rel-9", "decision_sequence": 12, "arm": "pinned",
                                   "pin_label": "eval"}
