"""The registry's memory budget on a real gateway: a failed call keeps nothing, what is shed under memory
pressure never breaks the attempt (later calls are served, recorded with the right index, and splice what
is still kept), and /health and /metrics show the bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from producers.sdk import Rollout
from producers.upstreams.base import GenerateRequest, GenerateResult, TokenChunk, UpstreamError
from producers.upstreams.embedded.engine import EmbeddedEngine
from tokentrail.settings import Settings

from .helpers import read_records

MODEL = "tokentrail-tiny"
SCRIPT = ["I will read the file.", "(never sent: the engine fails)", "The file says hello.", "Done."]


class SwitchableEngine:
    """The real embedded engine, failing every call while ``fail`` is set (a vLLM server that went away)."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine, self.fail = engine, False
        self.name, self.logprob_kind = engine.name, engine.logprob_kind

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        if self.fail:
            raise UpstreamError("the engine is down", 503, "engine_down")
        async for item in self.engine.generate_stream(request):
            yield item

    def __getattr__(self, name: str) -> Any:  # policy_version, close, max_model_len, ...
        return getattr(self.engine, name)


def test_failed_calls_keep_nothing_and_shedding_never_breaks_a_live_attempt(
    start_gateway, model_dir: Path, topics: dict[str, str], tokentrail_settings: Settings
) -> None:
    engine = SwitchableEngine(EmbeddedEngine(model_dir))
    with start_gateway(upstream=engine) as gw, Rollout(gw.url, script=SCRIPT) as rollout:
        registry = gw.gateway.ctx.registry
        client = rollout.openai_client(max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What does the file say?"}]

        def turn() -> None:
            reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
            messages.extend([{"role": "assistant", "content": reply.choices[0].message.content or ""},
                             {"role": "user", "content": "go on"}])

        turn()
        state = registry.get_active(rollout.rollout_id, rollout.attempt_id)
        kept = state.retained_bytes
        assert [c.call_index for c in state.recent] == [0] and list(state.outputs) == [0]

        engine.fail = True
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
        assert failed.value.status_code == 503
        # The failed call is recorded (below) but kept nowhere: same bytes, same delta bases.
        assert state.retained_bytes == kept and [c.call_index for c in state.recent] == [0]
        engine.fail = False

        state.drop_prompts()  # what memory pressure sheds first
        turn()  # still served, and the kept output is still spliced
        state.drop_prompts()
        state.drop_outputs()  # then the outputs
        turn()  # still served: rendered from the text

        health = httpx.get(f"{gw.url}/health").json()["registry_memory"]
        assert health["bytes"] == registry.bytes_used > 0 and health["max_bytes"] == registry.max_bytes
        metrics = httpx.get(f"{gw.url}/metrics").text
        line = next(x for x in metrics.splitlines() if x.startswith("tokentrail_gateway_registry_bytes "))
        assert float(line.split()[1]) > 0
    calls = sorted((r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 4,
                                               where={"rollout_id": rollout.rollout_id})),
                   key=lambda r: r["call_index"])
    assert [(c["call_index"], c["status"]) for c in calls] == [(0, "OK"), (1, "ERROR"), (2, "OK"), (3, "OK")]
    assert calls[2]["spliced_outputs"] >= 1, "without the kept prompts the kept output is still spliced"
    assert calls[3]["spliced_outputs"] == 0
