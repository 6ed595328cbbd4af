"""Acknowledgement order, harness disconnects, unattributed calls, stop strings, health and metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from models.reference.task import LOOKUP_TOOL, task_messages
from producers.gateway.session_refs import DEV_SESSION_REF_KEY, SessionRefs
from producers.sdk import Rollout
from producers.upstreams.base import ChatGenerateRequest, GenerateRequest, GenerateResult, TokenChunk, UpstreamError
from producers.upstreams.embedded.engine import EmbeddedEngine
from tokentrail.settings import Settings

from .helpers import engine_logprobs, output_of, prompts_of, read_records

MODEL = "tokentrail-tiny"


class ObservedSink:
    """The real Kafka sink, delivering a little late and noting when each delivery returned."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s
        self.delivered_at: list[float] = []

    async def deliver(self, topic: str, key: bytes, value: bytes) -> Any:
        await asyncio.sleep(self.delay_s)
        receipt = await self.inner.deliver(topic, key, value)
        self.delivered_at.append(time.monotonic())
        return receipt

    def __getattr__(self, name: str) -> Any:  # start, close, spool_depth, stats
        return getattr(self.inner, name)


class SlowEngine:
    """The real embedded engine, its tokens handed on slowly (so a harness can leave mid-generation)."""

    def __init__(self, engine: EmbeddedEngine, per_token_s: float) -> None:
        self.engine, self.per_token_s = engine, per_token_s
        self.name, self.logprob_kind = engine.name, engine.logprob_kind

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        async for item in self.engine.generate_stream(request):
            await asyncio.sleep(self.per_token_s)
            yield item

    async def policy_version(self) -> int:
        return await self.engine.policy_version()

    async def close(self) -> None:
        await self.engine.close()


class FailingEngine(SlowEngine):
    """The real embedded engine that fails after its first tokens, as a vLLM server that dies would."""

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        async for item in self.engine.generate_stream(request):
            if isinstance(item, TokenChunk):
                yield item
                raise UpstreamError("the engine went away mid-generation", 503, "engine_lost")

    async def generate_chat_stream(self, request: ChatGenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        async for item in self.engine.generate_chat_stream(request):  # pass-through: after its prompt
            if isinstance(item, TokenChunk):
                yield item
                raise UpstreamError("the engine went away mid-generation", 503, "engine_lost")


@pytest.mark.parametrize("prefix_mode", ["splice", "upstream"])
def test_a_failure_mid_stream_reaches_each_sdk_in_its_shape_and_is_recorded(
    start_gateway, topics: dict[str, str], model_dir, text_side, tokentrail_settings: Settings, prefix_mode: str
) -> None:
    failing = FailingEngine(EmbeddedEngine(model_dir), per_token_s=0.0)
    with start_gateway(upstream=failing, prefix_mode=prefix_mode) as gw, Rollout(gw.url) as rollout:
        messages = [{"role": "user", "content": "hi"}]
        chunks = []
        with pytest.raises(openai.APIError) as openai_error:
            for chunk in rollout.openai_client().chat.completions.create(
                model=MODEL, messages=messages, max_tokens=30, stream=True
            ):
                chunks.append(chunk)
        assert chunks and chunks[0].choices[0].delta.role == "assistant"  # the stream had begun
        with (
            pytest.raises(anthropic.APIStatusError) as anthropic_error,
            rollout.anthropic_client().messages.stream(model=MODEL, messages=messages, max_tokens=30) as events,
        ):
            for _ in events:
                pass
        calls = [r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 2,
                                            where={"rollout_id": rollout.rollout_id})]
    # Each SDK raised its own error type from the protocol's error event.
    assert "went away" in openai_error.value.message and openai_error.value.type == "server_error"
    assert anthropic_error.value.body["error"]["type"] == "overloaded_error"
    assert "went away" in anthropic_error.value.body["error"]["message"]
    # Both calls are on Kafka as failures, with the error and the body the harness got.
    assert [c["protocol"] for c in calls] == ["openai.chat", "anthropic.messages"]
    for call, prompt in zip(calls, prompts_of(calls), strict=True):
        assert call["status"] == "ERROR" and call["finish_reason"] == "error" and call["streamed"] is True
        assert call["error"]["type"] == "engine_lost" and call["error"]["status_code"] == 503
        assert "went away" in orjson.loads(call["response_json"]).get("error", {}).get("message", "")
        # What the engine ran and sampled before it failed is kept: the prompt (in pass-through, the one
        # the upstream reported) and the first chunk's ids with their logprobs.
        assert call["prefix_mode"] == prefix_mode
        assert prompt.tolist() == text_side.renderer.render(messages)
        output_ids, logprobs = output_of(call)
        assert len(output_ids) == len(logprobs) >= 1


def test_harness_is_answered_only_after_delivery(start_gateway) -> None:
    sinks: list[ObservedSink] = []

    def wrap(sink: Any) -> ObservedSink:
        sinks.append(ObservedSink(sink, delay_s=0.4))
        return sinks[0]

    with start_gateway(wrap_publisher=wrap) as gw, Rollout(gw.url) as rollout:
        sink = sinks[0]
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key="k")
        messages = [{"role": "user", "content": "hi"}]
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        answered = time.monotonic()
        assert sink.delivered_at[-1] < answered
        last_chunk_at = 0.0
        for _ in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, stream=True):
            last_chunk_at = time.monotonic()
        # AttemptStarted, two calls: the streamed call's last chunk came after its record was stored.
        assert len(sink.delivered_at) == 3 and sink.delivered_at[-1] < last_chunk_at


def test_a_harness_that_leaves_mid_stream_still_gets_its_call_recorded(
    start_gateway, topics: dict[str, str], model_dir, reference_model, tokentrail_settings: Settings
) -> None:
    slow = SlowEngine(EmbeddedEngine(model_dir), per_token_s=0.2)
    with start_gateway(upstream=slow) as gw, Rollout(gw.url) as rollout:
        body = {"model": MODEL, "prompt": "the value of the key is", "max_tokens": 200, "stream": True, "seed": 1}
        with httpx.stream("POST", f"{rollout.openai_base_url}/completions", json=body, timeout=30) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    break  # the harness goes away after its first text
        ((_, call),) = read_records(
            tokentrail_settings, topics["calls_topic"], 1, where={"rollout_id": rollout.rollout_id}
        )
    assert call["status"] == "ERROR" and call["error"]["type"] == "client_disconnected"
    assert call["finish_reason"] == "abort"
    output_ids, logprobs = output_of(call)
    assert 1 <= len(output_ids) < 200
    (prompt,) = prompts_of([call])
    assert logprobs == pytest.approx(engine_logprobs(reference_model, call, prompt), abs=2e-3)


def metric_value(metrics: str, name: str) -> str:
    return next(line.split()[1] for line in metrics.splitlines() if line.startswith(name + " "))


def test_unattributed_calls_stop_strings_health_and_metrics(
    start_gateway, topics: dict[str, str], text_side, tokentrail_settings: Settings
) -> None:
    with start_gateway() as gw:
        client = openai.OpenAI(
            base_url=gw.openai_base_url, api_key="anything", default_headers={"X-Session-Id": "pi-7"}
        )
        # Greedy output of the lookup prompt starts with a tool call block: stop on its newline.
        reply = client.chat.completions.create(
            model=MODEL, messages=task_messages("cat"), tools=[LOOKUP_TOOL], temperature=0.0, max_tokens=40, stop=["\n"]
        )
        health = httpx.get(f"{gw.url}/health").json()
        metrics = httpx.get(f"{gw.url}/metrics").text
    ((_, call),) = read_records(tokentrail_settings, topics["calls_topic"], 1)
    # The harness session id is recorded as its keyed ref (a user id may stand there), in the attempt id too.
    pi_7 = SessionRefs(DEV_SESSION_REF_KEY).ref("pi-7")
    assert call["rollout_id"] == "unattributed" and call["session_id"] == pi_7 and pi_7.startswith("hmac:")
    assert call["attempt_id"].endswith(f"/{pi_7}") and "pi-7" not in call["attempt_id"] and call["status"] == "OK"
    output_ids, _ = output_of(call)
    full_text = text_side.decode(output_ids.tolist())
    assert "\n" in full_text and reply.choices[0].message.content == full_text[: full_text.index("\n")]
    assert reply.choices[0].finish_reason == "stop" and call["sampling"]["stop"] == ["\n"]
    assert health["status"] == "ok" and health["sink"]["kafka_reachable"] is True
    assert 'tokentrail_gateway_calls_total{protocol="openai.chat",status="OK"} 1.0' in metrics
    assert "tokentrail_gateway_spool_depth 0.0" in metrics
    assert "tokentrail_gateway_call_seconds_bucket" in metrics
    # The one call's rendering was timed (its CPU: more than nothing, less than the whole call).
    render_count = float(metric_value(metrics, "tokentrail_gateway_render_seconds_count"))
    render_s = float(metric_value(metrics, "tokentrail_gateway_render_seconds_sum"))
    assert render_count == 1.0 and 0 < render_s < call["timings"]["total_ms"] / 1000


def test_sdk_finishes_failed_attempts(start_gateway, topics: dict[str, str], tokentrail_settings: Settings) -> None:
    with (
        start_gateway() as gw,
        pytest.raises(RuntimeError, match="environment crashed"),
        Rollout(gw.url, task_input=1) as rollout,
    ):
        rollout.event("OBSERVATION", {"screen": "..."})
        raise RuntimeError("environment crashed")
    env = read_records(tokentrail_settings, topics["env_topic"], 3, where={"rollout_id": rollout.rollout_id})
    finished = env[-1][1]
    assert env[-1][0] == "AttemptFinished" and finished["status"] == "FAILURE"
    assert (finished["call_count"], finished["event_count"]) == (0, 1)
    assert "environment crashed" in finished["final_artifacts_json"]


SECRET_IN_EXCEPTION = "password=hunter2 at /srv/secrets/key.pem"


class CrashingEngine(SlowEngine):
    """The real embedded engine with a bug: a request for exactly 3 tokens raises an exception whose text holds
    what no client may see."""

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        if request.sampling.max_tokens == 3:
            raise RuntimeError(SECRET_IN_EXCEPTION)
        async for item in self.engine.generate_stream(request):
            yield item


def test_a_500_says_nothing_of_the_exception(start_gateway, topics: dict[str, str], model_dir,
                                            tokentrail_settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 29, finding 10: a 500 (whole or mid-stream) gives the caller a reference into the gateway's log,
    never ``repr(exc)``; the record says the same; the calls before and after are served and recorded."""
    crashing = CrashingEngine(EmbeddedEngine(model_dir), per_token_s=0.0)
    messages = [{"role": "user", "content": "hi"}]
    with start_gateway(upstream=crashing) as gw, Rollout(gw.url) as rollout:
        client = rollout.openai_client(max_retries=0)
        assert client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2).choices  # before
        with pytest.raises(openai.InternalServerError) as whole:
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
        with pytest.raises(openai.APIError) as streamed:
            for _ in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, stream=True):
                pass
        assert client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2).choices  # after
        calls = [r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 4,
                                            where={"rollout_id": rollout.rollout_id})]
    for error in (whole.value, streamed.value):
        assert "hunter2" not in str(error.body) and "RuntimeError" not in str(error.body)
        assert "reference" in error.message
    assert [c["status"] for c in sorted(calls, key=lambda c: c["call_index"])] == ["OK", "ERROR", "ERROR", "OK"]
    assert not [c for c in calls if "hunter2" in (c["response_json"] + str(c["error"]))]
    assert "hunter2" in caplog.text  # the operator still has it, with the reference
