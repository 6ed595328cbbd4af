"""The real gateway on a real vLLM server (CPU build) serving our tiny model, driven with the openai SDK.

A three-call agent conversation with the lookup tool (a greedy tool call, the tool result, then a
follow-up user turn): non-streamed, streamed, and streamed in pass-through (vLLM renders the chat).
Every call record read back from Kafka must hold: the prompt ids our own renderer gives for that
request, output ids that decode to what the harness was told, and vLLM's logprobs for exactly those
ids, equal to a transformers forward pass on the same model (vLLM runs with processed logprobs, so the
reference applies the call's temperature/top-k/top-p).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import openai
import pytest

from models.reference.task import LOOKUP_TOOL, task_messages
from producers.gateway.text_side import ModelTextSide
from producers.rendered_prompt import PriorCall
from producers.sdk import Rollout
from tokentrail.settings import Settings

from .records import full_prompts, output_of, read_calls, reference_logprobs
from .vllm_server import VLLMServer

# Fixture setup can include installing vLLM (~2 min; 12+ with VLLM_INSTALLER=pip), building the model
# (~4 min) and the server start (1-4 min): longer than the default per-test timeout.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

# float32 on CPU in two implementations (vLLM's CPU kernels vs transformers): observed ~1e-6.
LOGPROB_ATOL = 1e-3
VLLM_VERSION = "0.32.0"


@dataclass
class Reply:
    message: dict[str, Any]  # the assistant message as a harness appends it to its history
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    content_deltas: list[str] = field(default_factory=list)


def chat(client: openai.OpenAI, model: str, messages: list[dict[str, Any]], stream: bool,
         **kwargs: Any) -> Reply:
    if not stream:
        reply = client.chat.completions.create(model=model, messages=messages, **kwargs)
        assert reply.usage is not None
        return Reply(reply.choices[0].message.model_dump(exclude_none=True), reply.choices[0].finish_reason,
                     reply.usage.prompt_tokens, reply.usage.completion_tokens)
    deltas: list[str] = []
    tool_calls: dict[int, dict[str, Any]] = {}
    finish, usage = None, None
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True,
                                                stream_options={"include_usage": True}, **kwargs):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            if choice.delta.content:
                deltas.append(choice.delta.content)
            for call in choice.delta.tool_calls or []:
                slot = tool_calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                          "function": {"name": "", "arguments": ""}})
                if call.function is not None:
                    slot["function"]["name"] += call.function.name or ""
                    slot["function"]["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    assert usage is not None, "the stream ended without a usage chunk"
    message: dict[str, Any] = {"role": "assistant", "content": "".join(deltas) or None}
    if tool_calls:
        message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
    return Reply(message, finish, usage.prompt_tokens, usage.completion_tokens, deltas)


def run_conversation(client: openai.OpenAI, model: str, stream: bool
                     ) -> tuple[list[list[dict[str, Any]]], list[Reply], list[dict[str, Any]]]:
    """Three calls; returns each call's messages, its reply and its sampling parameters."""
    tools = [LOOKUP_TOOL]
    sampling: list[dict[str, Any]] = [
        {"temperature": 0.0, "max_tokens": 40},  # greedy: the warmed-up model calls lookup("fox")
        {"temperature": 0.7, "seed": 11, "max_tokens": 20, "extra_body": {"top_k": 20}},
        {"temperature": 1.0, "top_p": 0.9, "seed": 12, "max_tokens": 30},
    ]
    conversation = task_messages("fox")
    requests: list[list[dict[str, Any]]] = []
    replies: list[Reply] = []
    for index, params in enumerate(sampling):
        requests.append(list(conversation))
        reply = chat(client, model, conversation, stream, tools=tools, **params)
        replies.append(reply)
        if index == 0:
            assert reply.finish_reason == "tool_calls", reply
            (call,) = reply.message["tool_calls"]
            assert call["function"]["name"] == "lookup"
            assert json.loads(call["function"]["arguments"]) == {"key": "fox"}
            conversation += [reply.message, {"role": "tool", "tool_call_id": call["id"], "content": "red"}]
        elif index == 1:
            assert reply.finish_reason in ("stop", "length", "tool_calls")
            conversation += [reply.message, {"role": "user", "content": 'And what is "owl"?'}]
    return requests, replies, sampling


def harness_view(message: dict[str, Any]) -> dict[str, Any]:
    """Content and tool calls (name, parsed arguments) of an assistant message."""
    return {"content": message.get("content") or "",
            "tool_calls": [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                           for c in message.get("tool_calls") or []]}


def check_records(calls: list[dict[str, Any]], requests: list[list[dict[str, Any]]], replies: list[Reply],
                  sampling: list[dict[str, Any]], *, text_side: ModelTextSide, model: Any, server: VLLMServer,
                  stream: bool, prefix_mode: str) -> None:
    prompts = full_prompts(calls)
    outputs = [output_of(c)[0] for c in calls]
    renderer = text_side.renderer
    for i, (call, prompt, reply) in enumerate(zip(calls, prompts, replies, strict=True)):
        context = f"call {i}"
        assert call["status"] == "OK" and call["call_index"] == i, context
        assert call["protocol"] == "openai.chat" and call["streamed"] is stream, context
        assert call["prefix_mode"] == prefix_mode, context
        # Generated by the vLLM server, under the logprob distribution it was started with.
        assert call["versions"]["engine"] == f"vllm/{VLLM_VERSION}", call["versions"]
        assert call["versions"]["upstream"] == server.url, call["versions"]
        assert call["logprob_kind"] == "PROCESSED", context
        details = json.loads(call["sampling"]["extra_json"])["engine_details"]
        assert str(details["system_fingerprint"]).startswith(f"vllm-{VLLM_VERSION}"), details
        params = sampling[i]
        assert call["sampling"]["temperature"] == pytest.approx(params["temperature"]), context
        assert call["sampling"]["seed"] == params.get("seed"), context
        assert call["sampling"]["top_k"] == params.get("extra_body", {}).get("top_k", 0), context
        assert call["sampling"]["top_p"] == pytest.approx(params.get("top_p", 1.0)), context

        # Prompt: exactly our own rendering of this request (the template's text; in splice mode the
        # attempt's earlier sampled ids wherever the template repeats them).
        # Pass-through: vLLM rendered it with the model's template (the same one here), so the ids it ran
        # are again exactly our rendering; the record says the template was the upstream's.
        messages = requests[i]
        assert renderer.decode(prompt.tolist()) == renderer.render_text(messages, [LOOKUP_TOOL]), context
        if prefix_mode == "upstream":
            assert call["versions"]["chat_template_fingerprint"] == "upstream", context
        if prefix_mode in ("retokenize", "upstream"):
            expected = renderer.render(messages, [LOOKUP_TOOL])
        else:
            prior = [PriorCall(j, prompts[j].tolist(), outputs[j]) for j in range(i)]
            expected = renderer.render_spliced(messages, [LOOKUP_TOOL], prior).prompt_ids
        assert prompt.tolist() == expected, context
        assert reply.prompt_tokens == len(prompt), context

        # Output: the recorded ids decode to exactly what the harness got back.
        output_ids, logprobs = output_of(call)
        assert len(output_ids) == len(logprobs) == reply.completion_tokens > 0, context
        parsed = text_side.parse(text_side.decode(output_ids))
        told = harness_view(reply.message)
        assert told == {"content": parsed.content,
                        "tool_calls": [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]}, context

        # Logprobs: vLLM's, for exactly these ids, equal to a transformers forward pass.
        reference = reference_logprobs(model, call, prompt)
        np.testing.assert_allclose(logprobs, reference, atol=LOGPROB_ATOL, rtol=0, err_msg=context)
        assert np.all(logprobs <= 0.0) and np.all(np.isfinite(logprobs)), context
    # The tool call is the first output; the conversation continued from it.
    assert calls[0]["finish_reason"] == "stop" and outputs[0][-1] in text_side.stop_token_ids
    if prefix_mode == "splice":
        # Each later prompt extends the previous prompt ‖ output token for token (and is stored as a delta).
        for i in range(len(calls) - 1):
            sequence = [*prompts[i].tolist(), *outputs[i]]
            assert prompts[i + 1].tolist()[: len(sequence)] == sequence, f"prefix {i} -> {i + 1}"
            assert calls[i + 1]["prompt"]["base_call_id"] == calls[i]["call_id"]


@pytest.mark.parametrize(("stream", "prefix_mode"), [(False, "splice"), (True, "retokenize"), (True, "upstream")],
                         ids=["unary-splice", "stream-retokenize", "stream-upstream"])
def test_tool_conversation_on_vllm_is_recorded_token_exact(
    vllm_gateway: Any, vllm_server: VLLMServer, live_topics: dict[str, str], live_text_side: ModelTextSide,
    live_reference_model: Any, tokentrail_settings: Settings, stream: bool, prefix_mode: str,
) -> None:
    model = tokentrail_settings.model.name
    with vllm_gateway(prefix_mode=prefix_mode) as gw, Rollout(gw.url, task_input={"key": "fox"}) as rollout:
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key="harness-key")
        requests, replies, sampling = run_conversation(client, model, stream)
    calls = read_calls(tokentrail_settings, live_topics["calls_topic"], rollout.rollout_id, len(requests))
    check_records(calls, requests, replies, sampling, text_side=live_text_side, model=live_reference_model,
                  server=vllm_server, stream=stream, prefix_mode=prefix_mode)
    if stream:
        # Text streamed as it was sampled: the first (tool-call) turn shows no raw markup.
        assert not any("<tool_call>" in d for d in replies[0].content_deltas)
        assert "".join(replies[2].content_deltas) == (replies[2].message.get("content") or "")
