"""The official anthropic SDK against a real gateway on the embedded engine; records read back from Kafka."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import orjson
import pytest

from models.reference.task import LOOKUP_TOOL, TASK_SYSTEM_PROMPT, task_question
from producers.gateway.session_refs import DEV_SESSION_REF_KEY, SessionRefs
from producers.sdk import Rollout
from tokentrail.settings import Settings

from .checks import check_calls, prefix_holds
from .helpers import read_records

MODEL = "tokentrail-tiny"
TOOL = {
    "name": "lookup",
    "description": LOOKUP_TOOL["function"]["description"],
    "input_schema": LOOKUP_TOOL["function"]["parameters"],
}
# What the adapter makes of TOOL (its internal chat form must equal the model's training tool).
INTERNAL_TOOL = LOOKUP_TOOL


def send(client: anthropic.Anthropic, stream: bool, beta: bool, **kwargs: Any) -> Any:
    if beta:  # POST /v1/messages?beta=true with an anthropic-beta header, as Claude Code sends
        create = client.beta.messages
        kwargs["betas"] = ["interleaved-thinking-2025-05-14"]
        kwargs["extra_query"] = {"beta": "true"}  # as Claude Code sends (this SDK version does not add it)
    else:
        create = client.messages
    if not stream:
        return create.create(model=MODEL, **kwargs)
    with create.stream(model=MODEL, **kwargs) as events:
        kinds = [event.type for event in events]
        final = events.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    return final


@pytest.mark.parametrize(("stream", "beta"), [(False, False), (True, True)])
def test_tool_use_conversation_is_recorded_token_exact(
    start_gateway,
    topics: dict[str, str],
    text_side,
    reference_model,
    tokentrail_settings: Settings,
    stream: bool,
    beta: bool,
) -> None:
    # Claude Code style: system as text blocks with cache_control, a session header, an x-api-key.
    system = [{"type": "text", "text": TASK_SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": task_question("owl")}]
    with start_gateway() as gw, Rollout(gw.url, task_input={"key": "owl"}) as rollout:
        client = anthropic.Anthropic(
            base_url=gw.url,
            api_key=rollout.api_key,
            default_headers={"X-Claude-Code-Session-Id": "session-42"},
        )
        first = send(
            client,
            stream,
            beta,
            system=system,
            messages=messages,
            tools=[TOOL],
            max_tokens=40,
            extra_body={"temperature": 0.0},  # this SDK version has no sampling arguments
        )
        assert first.stop_reason == "tool_use"
        tool_use = next(b for b in first.content if b.type == "tool_use")
        assert tool_use.name == "lookup" and set(tool_use.input) == {"key"}
        messages += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": tool_use.id,
                        "content": [{"type": "text", "text": "gold"}],
                    }
                ],
            },
        ]
        second = send(
            client,
            stream,
            beta,
            system=system,
            messages=messages,
            tools=[TOOL],
            max_tokens=16,
            extra_body={"top_k": 50},
        )
        assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
        counted = client.messages.count_tokens(model=MODEL, system=system, messages=messages, tools=[TOOL])

    calls = [
        r
        for _, r in read_records(
            tokentrail_settings, topics["calls_topic"], 2, where={"rollout_id": rollout.rollout_id}
        )
    ]
    sys_message = {"role": "system", "content": TASK_SYSTEM_PROMPT}
    first_chat = [sys_message, {"role": "user", "content": task_question("owl")}]
    assistant = {
        "role": "assistant",
        "content": "".join(b.text for b in first.content if b.type == "text"),
        "tool_calls": [
            {
                "id": tool_use.id,
                "type": "function",
                "function": {
                    "name": "lookup",
                    "arguments": json.dumps(tool_use.input),  # as the adapter serialises input
                },
            }
        ],
    }
    second_chat = [*first_chat, assistant, {"role": "tool", "tool_call_id": tool_use.id, "content": "gold"}]
    prompts = check_calls(
        calls,
        text_side=text_side,
        model=reference_model,
        rollout_id=rollout.rollout_id,
        attempt_id=rollout.attempt_id,
        prefix_mode="splice",
        conversations=[(first_chat, [INTERNAL_TOOL]), (second_chat, [INTERNAL_TOOL])],
    )
    assert counted.input_tokens == len(prompts[1])
    assert prefix_holds(calls, prompts, 0), "the tool_use block re-entered as the exact sampled ids"
    for call in calls:
        assert call["protocol"] == "anthropic.messages" and call["streamed"] is stream
        assert call["session_id"] == SessionRefs(DEV_SESSION_REF_KEY).ref("session-42")  # keyed, never the id
        request = orjson.loads(call["request_json"])
        credentials = {k: v for k, v in request["headers"].items() if k in ("authorization", "x-api-key")}
        assert credentials and set(credentials.values()) == {"[redacted]"}
        assert (request["query"] == "beta=true") is beta
        assert request["headers"]["anthropic-version"] == client.default_headers["anthropic-version"]
        assert ("anthropic-beta" in request["headers"]) is beta
    assert calls[1]["sampling"]["top_k"] == 50
    # What the SDK put together (from the events, or the body) is what was recorded and sampled.
    for reply, record in zip((first, second), calls, strict=True):
        assert blocks_of(reply.model_dump()) == blocks_of(orjson.loads(record["response_json"]))
    assert (
        first.usage.input_tokens == len(prompts[0])
        and first.usage.output_tokens == len(calls[0]["output_ids"]) // 4
    )


def blocks_of(message: dict[str, Any]) -> list[tuple[str, Any]]:
    """The content blocks of a message, without ids and signatures."""
    keep = {"text": "text", "thinking": "thinking", "tool_use": "input"}
    return [(b["type"], b[keep[b["type"]]]) for b in message["content"]]


def test_thinking_blocks_round_trip_and_a_dropped_one_breaks_the_prefix(
    start_gateway, topics: dict[str, str], text_side, reference_model, tokentrail_settings: Settings
) -> None:
    """Claude Code sends earlier thinking blocks back. They reach the template as reasoning; the template
    keeps only the last assistant turn's, so once a newer turn exists the record says the earlier call's
    tokens are no longer a prefix, and why."""
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "greet back", "signature": "sig-from-an-earlier-session"},
            {"type": "text", "text": "hello"},
        ]},
        {"role": "user", "content": 'What is "owl"?'},
    ]
    with start_gateway() as gw, Rollout(gw.url, task_input={}) as rollout:
        client = anthropic.Anthropic(base_url=rollout.anthropic_base_url, api_key="k")
        first = send(client, True, True, system="Answer with one word.", messages=history, max_tokens=8)
        later = [*history, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": 'And "cat"?'}]
        second = send(client, False, False, system="Answer with one word.", messages=later, max_tokens=8)
    calls = [
        r
        for _, r in read_records(
            tokentrail_settings, topics["calls_topic"], 2, where={"rollout_id": rollout.rollout_id}
        )
    ]
    system = {"role": "system", "content": "Answer with one word."}
    first_chat = [system, {"role": "user", "content": "Hi?"},
                  {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
                  {"role": "user", "content": 'What is "owl"?'}]
    answer = {"role": "assistant", "content": "".join(b.text for b in first.content if b.type == "text")}
    thinking = "".join(b.thinking for b in first.content if b.type == "thinking")
    if thinking:
        answer["reasoning_content"] = thinking
    assert not any(b.type == "tool_use" for b in first.content)  # no tools offered
    prompts = check_calls(
        calls,
        text_side=text_side,
        model=reference_model,
        rollout_id=rollout.rollout_id,
        attempt_id=rollout.attempt_id,
        prefix_mode="splice",
        conversations=[(first_chat, None), ([*first_chat, answer, {"role": "user", "content": 'And "cat"?'}], None)],
    )
    assert "greet back" in text_side.renderer.decode(prompts[0].tolist())
    assert "greet back" not in text_side.renderer.decode(prompts[1].tolist())
    assert not prefix_holds(calls, prompts, 0)
    assert any("reasoning" in b for b in calls[1]["prefix_breaks"]), calls[1]["prefix_breaks"]
    for reply, record in zip((first, second), calls, strict=True):
        assert blocks_of(reply.model_dump()) == blocks_of(orjson.loads(record["response_json"]))
    request = orjson.loads(calls[1]["request_json"])
    assert request["body"]["messages"][1]["content"][0]["thinking"] == "greet back"
