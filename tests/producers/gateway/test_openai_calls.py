"""The official openai SDK against a real gateway on the embedded engine; records read back from Kafka."""

from __future__ import annotations

import json
from typing import Any

import openai
import orjson
import pytest

from models.reference.task import LOOKUP_TOOL, task_messages
from producers.sdk import Rollout
from tokentrail.settings import Settings

from .checks import check_calls, prefix_holds
from .helpers import output_of, read_records

MODEL = "tokentrail-tiny"


def chat(
    client: openai.OpenAI, messages: list[dict[str, Any]], stream: bool, **kwargs: Any
) -> dict[str, Any]:
    """One chat call; returns the assistant message as a harness would append it to its history."""
    if not stream:
        reply = client.chat.completions.create(model=MODEL, messages=messages, **kwargs)
        message = reply.choices[0].message.model_dump(exclude_none=True)
        return {"message": message, "finish_reason": reply.choices[0].finish_reason, "usage": reply.usage}
    content, tool_calls, finish, usage, roles = "", {}, None, None, []
    for chunk in client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}, **kwargs
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            roles += [delta.role] if delta.role else []
            content += delta.content or ""
            for call in delta.tool_calls or []:
                slot = tool_calls.setdefault(
                    call.index, {"id": call.id, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["function"]["name"] += call.function.name or ""
                slot["function"]["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    assert roles == ["assistant"]
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if tool_calls:
        message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
    return {"message": message, "finish_reason": finish, "usage": usage}


@pytest.mark.parametrize(
    ("stream", "prefix_mode"), [(False, "splice"), (True, "splice"), (False, "retokenize")]
)
def test_tool_conversation_is_recorded_token_exact(
    start_gateway,
    topics: dict[str, str],
    text_side,
    reference_model,
    tokentrail_settings: Settings,
    stream: bool,
    prefix_mode: str,
) -> None:
    with (
        start_gateway(prefix_mode=prefix_mode) as gw,
        Rollout(
            gw.url, task_input={"key": "fox"}, group_key={"task": "lookup"}, expected_group_size=1
        ) as rollout,
    ):
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key="harness-key")
        messages = task_messages("fox")
        conversations = [(messages, [LOOKUP_TOOL])]
        # Greedy: the warmed-up model calls the lookup tool for the asked key.
        first = chat(client, messages, stream, tools=[LOOKUP_TOOL], temperature=0.0, max_tokens=40)
        assert first["finish_reason"] == "tool_calls"
        (call,) = first["message"]["tool_calls"]
        assert call["function"]["name"] == "lookup" and set(json.loads(call["function"]["arguments"])) == {
            "key"
        }
        messages = [
            *messages,
            first["message"],
            {"role": "tool", "tool_call_id": call["id"], "content": "red"},
        ]
        conversations.append((messages, [LOOKUP_TOOL]))
        # Sampled with temperature and top-p, where the processed logprobs the engine records differ
        # from the raw ones: the logprob check then also proves the recorded kind.
        second = chat(client, messages, stream, tools=[LOOKUP_TOOL], seed=11, max_tokens=20, temperature=0.7,
                      top_p=0.9)
        assert second["finish_reason"] in ("stop", "length", "tool_calls")
        assert second["usage"].prompt_tokens > first["usage"].prompt_tokens + first["usage"].completion_tokens
        rollout.event("TOOL_RESULT", {"output": "red"}, call_index=0, name="lookup")

    calls = [
        r
        for _, r in read_records(
            tokentrail_settings, topics["calls_topic"], 2, where={"rollout_id": rollout.rollout_id}
        )
    ]
    internal = [
        ([{k: v for k, v in m.items() if k != "refusal"} for m in msgs], tools)
        for msgs, tools in conversations
    ]
    prompts = check_calls(
        calls,
        text_side=text_side,
        model=reference_model,
        rollout_id=rollout.rollout_id,
        attempt_id=rollout.attempt_id,
        conversations=internal,
        prefix_mode=prefix_mode,
    )
    assert all(c["protocol"] == "openai.chat" and c["streamed"] is stream for c in calls)
    assert calls[0]["sampling"]["temperature"] == 0.0 and calls[1]["sampling"]["seed"] == 11
    assert (calls[1]["sampling"]["temperature"], calls[1]["sampling"]["top_p"]) == (0.7, 0.9)
    # What the SDK put together (from the stream, or the body) is what was recorded and sampled.
    for reply, record in zip((first, second), calls, strict=True):
        assert same_message(reply["message"], record, text_side)
    if prefix_mode == "splice":
        # The second prompt reuses the first call's exact ids: a token-level prefix, stored as a delta.
        assert prefix_holds(calls, prompts, 0)
        assert calls[1]["spliced_outputs"] >= 1 and calls[1]["prefix_breaks"] == []
        assert calls[1]["prompt"]["base_call_id"] == calls[0]["call_id"]
        assert calls[1]["prompt"]["base_prefix_len"] == len(prompts[0]) + len(calls[0]["output_ids"]) // 4
    request = orjson.loads(calls[1]["request_json"])
    assert request["body"]["messages"][2]["tool_calls"][0]["id"] == call["id"]
    assert request["headers"]["authorization"] == "[redacted]"

    env = read_records(tokentrail_settings, topics["env_topic"], 3, where={"rollout_id": rollout.rollout_id})
    assert [name for name, _ in env] == ["AttemptStarted", "EnvStep", "AttemptFinished"]
    assert env[1][1]["call_id"] == calls[0]["call_id"] and env[1][1]["kind"] == "TOOL_RESULT"
    finished = env[2][1]
    assert (finished["status"], finished["call_count"], finished["event_count"]) == ("SUCCESS", 2, 1)
    assert env[0][1]["group_key"] == {"task": "lookup"} and env[0][1]["expected_group_size"] == 1


def same_message(message: dict[str, Any], record: dict[str, Any], text_side: Any) -> bool:
    """The assistant message a client got equals the record's response and the parse of its output ids."""
    recorded = orjson.loads(record["response_json"])["choices"][0]["message"]
    parsed = text_side.parse(text_side.decode(output_of(record)[0].tolist()))

    def calls_of(m: dict[str, Any]) -> list[tuple[str, Any]]:
        return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls") or []]

    return (
        (message.get("content") or "") == (recorded.get("content") or "") == parsed.content
        and calls_of(message) == calls_of(recorded) == [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]
        and [c["id"] for c in message.get("tool_calls") or []] == [c["id"] for c in recorded.get("tool_calls") or []]
    )


def test_identity_by_headers_on_the_plain_base_url(
    start_gateway, topics: dict[str, str], text_side, reference_model, tokentrail_settings: Settings
) -> None:
    """A harness that cannot change its base URL path names its rollout and attempt in headers."""
    with start_gateway() as gw, Rollout(gw.url, task_input={}) as rollout:
        client = openai.OpenAI(
            base_url=gw.openai_base_url,
            api_key="k",
            default_headers={"X-Rollout-Id": rollout.rollout_id, "X-Attempt-Id": rollout.attempt_id},
        )
        reply = chat(client, task_messages("elk"), stream=True, tools=[LOOKUP_TOOL], seed=2, max_tokens=12)
    ((_, call),) = read_records(
        tokentrail_settings, topics["calls_topic"], 1, where={"rollout_id": rollout.rollout_id}
    )
    check_calls(
        [call],
        text_side=text_side,
        model=reference_model,
        rollout_id=rollout.rollout_id,
        attempt_id=rollout.attempt_id,
        conversations=[(task_messages("elk"), [LOOKUP_TOOL])],
        prefix_mode="splice",
    )
    assert same_message(reply["message"], call, text_side)
    assert orjson.loads(call["request_json"])["headers"]["x-rollout-id"] == rollout.rollout_id


def test_dropped_reasoning_breaks_the_token_prefix(
    start_gateway, topics: dict[str, str], text_side, reference_model, tokentrail_settings: Settings
) -> None:
    """The template renders reasoning only for the last assistant turn: once a newer turn exists the old
    reasoning disappears, so the earlier call's prompt ‖ output is no longer a prefix."""
    history = [
        {"role": "system", "content": "Answer with one word."},
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
        {"role": "user", "content": 'What is "owl"?'},
    ]
    with start_gateway(prefix_mode="splice") as gw, Rollout(gw.url, task_input={}) as rollout:
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key="k")
        first = chat(client, history, stream=False, seed=3, max_tokens=8)
        later = [*history, first["message"], {"role": "user", "content": 'And "cat"?'}]
        chat(client, later, stream=False, seed=4, max_tokens=8)
    calls = [
        r
        for _, r in read_records(
            tokentrail_settings, topics["calls_topic"], 2, where={"rollout_id": rollout.rollout_id}
        )
    ]
    prompts = check_calls(
        calls,
        text_side=text_side,
        model=reference_model,
        rollout_id=rollout.rollout_id,
        attempt_id=rollout.attempt_id,
        conversations=[(history, None), (later, None)],
        prefix_mode="splice",
    )
    assert "greet back" in text_side.renderer.decode(prompts[0].tolist())
    assert "greet back" not in text_side.renderer.decode(prompts[1].tolist())
    assert not prefix_holds(calls, prompts, 0)
    assert any("reasoning" in b for b in calls[1]["prefix_breaks"]), calls[1]["prefix_breaks"]


def test_completions_with_token_ids_and_text(
    start_gateway, topics: dict[str, str], text_side, reference_model, tokentrail_settings: Settings
) -> None:
    prompt_ids = text_side.renderer.render(task_messages("owl"), [LOOKUP_TOOL])
    with start_gateway() as gw, Rollout(gw.url) as rollout:
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key="k")
        by_ids = client.completions.create(
            model=MODEL,
            prompt=prompt_ids,
            max_tokens=12,
            logprobs=1,
            seed=5,
            extra_body={"return_token_ids": True},
        )
        streamed = "".join(
            c.choices[0].text
            for c in client.completions.create(
                model=MODEL, prompt="Hello there", max_tokens=6, stream=True, seed=6
            )
            if c.choices
        )
    calls = [
        r
        for _, r in read_records(
            tokentrail_settings, topics["calls_topic"], 2, where={"rollout_id": rollout.rollout_id}
        )
    ]
    from .helpers import engine_logprobs, output_of, prompts_of

    prompts = prompts_of(calls)
    assert prompts[0].tolist() == prompt_ids
    assert prompts[1].tolist() == text_side.encode_text("Hello there")
    output_ids, logprobs = output_of(calls[0])
    returned = by_ids.model_dump()["choices"][0]
    assert returned["token_ids"] == output_ids.tolist()
    assert by_ids.choices[0].logprobs.token_logprobs == pytest.approx(logprobs.tolist(), abs=1e-6)
    assert by_ids.choices[0].text == text_side.decode(output_ids.tolist())
    assert streamed == text_side.decode(output_of(calls[1])[0].tolist())
    for call, prompt in zip(calls, prompts, strict=True):
        assert call["protocol"] == "openai.completions" and call["prefix_mode"] == "tokens"
        assert output_of(call)[1] == pytest.approx(engine_logprobs(reference_model, call, prompt), abs=2e-3)
