"""Protocol adapters: requests to the internal chat form, outcomes back to each protocol."""

from __future__ import annotations

import json

import orjson
import pytest

from producers.gateway import anthropic_adapter, openai_adapter
from producers.gateway.body import validate
from producers.gateway.chat import CallOutcome, ToolCallOut
from producers.gateway.errors import GatewayError
from producers.gateway.models_anthropic import MessagesRequest
from producers.gateway.models_openai import ChatCompletionRequest, CompletionRequest


def _anthropic(body: dict) -> MessagesRequest:
    return validate(MessagesRequest, {"model": "m", "max_tokens": 10, **body})


def test_anthropic_system_blocks_tools_and_results_become_chat_messages() -> None:
    req = _anthropic(
        {
            "system": [
                {"type": "text", "text": "You are X.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Be brief."},
            ],
            "tools": [{"name": "lookup", "description": "Look up.", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "plan", "signature": "sig"},
                        {"type": "text", "text": "Let me look."},
                        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"key": "fox"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "red"}],
                        },
                        {"type": "text", "text": "and?"},
                    ],
                },
            ],
        }
    )
    call = anthropic_adapter.to_internal(req, 100)
    assert call.messages == [
        {"role": "system", "content": "You are X.Be brief."},  # end to end, as vLLM's /v1/messages joins them
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": "plan",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": json.dumps({"key": "fox"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "red"},
        {"role": "user", "content": "and?"},
    ]
    # Key order too: templates serialise tools as given, so it must match OpenAI's.
    assert [list(t["function"]) for t in call.tools] == [["name", "description", "parameters"]]
    assert call.tools == [
        {
            "type": "function",
            "function": {"name": "lookup", "description": "Look up.", "parameters": {"type": "object"}},
        }
    ]
    assert call.sampling.max_tokens == 10


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0.type",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "web", "type": "web_search_20250305"}],
            },
            "tools.0.type",
        ),
    ],
)
def test_anthropic_unsupported_input_is_refused_with_the_offending_param(body: dict, param: str) -> None:
    with pytest.raises(GatewayError) as info:
        anthropic_adapter.to_internal(_anthropic(body), 100)
    assert info.value.status == 400
    assert info.value.param == param
    assert info.value.anthropic_body()["error"]["type"] == "invalid_request_error"


def test_a_budget_over_the_gateway_cap_is_served_with_the_cap_and_the_request_kept() -> None:
    call = anthropic_adapter.to_internal(_anthropic({"messages": [{"role": "user", "content": "x"}],
                                                     "max_tokens": 101}), 100)
    assert (call.sampling.max_tokens, call.sampling.requested_max_tokens) == (100, 101)


def test_openai_messages_are_normalised() -> None:
    req = validate(
        ChatCompletionRequest,
        {
            "model": "m",
            "max_completion_tokens": 5,
            "stop": "END",
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "sys"}]},
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning": "r",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "out"},
            ],
        },
    )
    call = openai_adapter.chat_to_internal(req, 100)
    assert call.messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "r",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
    ]
    assert call.sampling.max_tokens == 5 and call.sampling.stop == ["END"]


def test_openai_refuses_n_above_one_and_multiple_prompts() -> None:
    with pytest.raises(GatewayError, match="n=1"):
        openai_adapter.chat_to_internal(
            validate(
                ChatCompletionRequest, {"model": "m", "n": 2, "messages": [{"role": "user", "content": "x"}]}
            ),
            100,
        )
    with pytest.raises(GatewayError, match="one prompt"):
        openai_adapter.completion_to_internal(
            validate(CompletionRequest, {"model": "m", "prompt": ["a", "b"]}), 100
        )
    call = openai_adapter.completion_to_internal(
        validate(CompletionRequest, {"model": "m", "prompt": [5, 6]}), 100
    )
    assert call.prompt_ids == [5, 6] and call.sampling.max_tokens == 16


def _outcome(**overrides: object) -> CallOutcome:
    base = dict(
        call_id="abc",
        call_index=0,
        model="m",
        created=1,
        prompt_ids=[1, 2, 3],
        output_ids=[7, 8, 2],
        output_logprobs=[-0.5, -1.0, -0.1],
        text="x",
        content="hello",
        reasoning="think",
        tool_calls=[ToolCallOut("call_1", "lookup", '{"key": "fox"}')],
        finish_reason="stop",
    )
    base.update(overrides)
    return CallOutcome(**base)  # type: ignore[arg-type]


def test_anthropic_response_and_stream_events() -> None:
    outcome = _outcome()
    body = anthropic_adapter.message_response(outcome)
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use"]
    assert body["content"][2]["input"] == {"key": "fox"}
    assert body["stop_reason"] == "tool_use"
    assert body["usage"]["input_tokens"] == 3 and body["usage"]["output_tokens"] == 3

    stream = anthropic_adapter.MessageStream("abc", "m")
    frames = (
        stream.start([1, 2, 3]) + stream.reasoning("thi") + stream.reasoning("nk") + stream.content("hello")
    )
    frames += stream.finish(outcome)
    events = [f.split(b"\n")[0].removeprefix(b"event: ").decode() for f in frames]
    assert events == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    payloads = [orjson.loads(f.split(b"\ndata: ")[1]) for f in frames]
    assert payloads[5]["delta"]["type"] == "signature_delta"
    assert payloads[11]["delta"] == {"type": "input_json_delta", "partial_json": '{"key":"fox"}'}
    assert payloads[13]["delta"]["stop_reason"] == "tool_use"


def test_openai_chat_stream_ends_with_usage_and_done() -> None:
    req = validate(
        ChatCompletionRequest,
        {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "x"}],
        },
    )
    stream = openai_adapter.ChatStream(req, "abc", "m", 1, str, "fp")
    frames = stream.start([1]) + stream.content("hel") + stream.finish(_outcome())
    assert frames[-1] == b"data: [DONE]\n\n"
    chunks = [orjson.loads(f.removeprefix(b"data: ")) for f in frames[:-1]]
    assert chunks[2]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "lookup"
    assert chunks[3]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["total_tokens"] == 6
