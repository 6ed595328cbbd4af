"""Pass-through (``prefix_mode = "upstream"``): the upstream renders the conversation with its own chat
template and the gateway records the prompt ids it reports. On the embedded engine, which renders with
transformers' ``apply_chat_template`` as a vLLM server does, through the official SDKs."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import orjson
import pytest

from models.reference.task import LOOKUP_TOOL, task_messages
from producers.sdk import Rollout
from tokentrail.settings import Settings

from .checks import check_calls
from .helpers import read_records
from .test_openai_calls import MODEL, chat, same_message


@pytest.mark.parametrize("stream", [False, True])
def test_openai_tool_conversation_rendered_upstream_is_recorded_as_it_ran(
    start_gateway, topics: dict[str, str], text_side, reference_model, tokentrail_settings: Settings, stream: bool
) -> None:
    with start_gateway(prefix_mode="upstream") as gw, Rollout(gw.url, task_input={"key": "fox"}) as rollout:
        client = rollout.openai_client()
        messages = task_messages("fox")
        first = chat(client, messages, stream, tools=[LOOKUP_TOOL], temperature=0.0, max_tokens=40)
        assert first["finish_reason"] == "tool_calls"  # the gateway still parses the tool call itself
        (call,) = first["message"]["tool_calls"]
        later = [*messages, first["message"], {"role": "tool", "tool_call_id": call["id"], "content": "red"}]
        second = chat(client, later, stream, tools=[LOOKUP_TOOL], seed=11, max_tokens=20, temperature=0.7)
    calls = [r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 2,
                                        where={"rollout_id": rollout.rollout_id})]
    # The prompts are exactly the template's rendering (the engine's and the pinned one are the same
    # here), with the engine's logprobs for the sampled ids; the mode is on every record.
    prompts = check_calls(
        calls, text_side=text_side, model=reference_model, rollout_id=rollout.rollout_id,
        attempt_id=rollout.attempt_id, prefix_mode="upstream",
        conversations=[(messages, [LOOKUP_TOOL]), (later, [LOOKUP_TOOL])],
    )
    assert all(c["spliced_outputs"] == 0 and c["prefix_breaks"] == [] for c in calls)
    for reply, record in zip((first, second), calls, strict=True):
        assert same_message(reply["message"], record, text_side)
    assert second["usage"].prompt_tokens == len(prompts[1])


def test_streams_announce_the_upstreams_prompt_before_any_text(
    start_gateway, topics: dict[str, str], tokentrail_settings: Settings, text_side
) -> None:
    with start_gateway(prefix_mode="upstream") as gw, Rollout(gw.url, task_input={}) as rollout:
        chunks = list(rollout.openai_client().chat.completions.create(
            model=MODEL, messages=task_messages("owl"), max_tokens=6, stream=True, seed=1,
            extra_body={"return_token_ids": True}))
        client = rollout.anthropic_client()
        with client.messages.stream(model=MODEL, max_tokens=6, messages=[{"role": "user", "content": "Hi?"}],
                                    system="Answer with one word.") as events:
            kinds = [e.type for e in events]
            start = events.get_final_message()
        counted = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hi?"}],
                                               system="Answer with one word.")
    calls = [r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 2,
                                        where={"rollout_id": rollout.rollout_id})]
    prompts = [orjson.loads(c["request_json"]) for c in calls]
    assert [c["prefix_mode"] for c in calls] == ["upstream", "upstream"]
    expected = text_side.renderer.render(task_messages("owl"))
    first: dict[str, Any] = chunks[0].model_extra or {}
    assert first["prompt_token_ids"] == expected and chunks[0].choices[0].delta.role == "assistant"
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    anthropic_prompt = text_side.renderer.render([{"role": "system", "content": "Answer with one word."},
                                                 {"role": "user", "content": "Hi?"}])
    assert start.usage.input_tokens == len(anthropic_prompt) == counted.input_tokens
    assert prompts[1]["body"]["system"] == "Answer with one word."


def test_pass_through_needs_an_upstream_that_renders(start_gateway) -> None:
    class TokensOnly:
        name = "tokens-only"

    with pytest.raises(ValueError, match="renders chats itself"), start_gateway(
            prefix_mode="upstream", upstream=TokensOnly()):
        pass


def test_refusals_are_still_in_the_callers_protocol(start_gateway) -> None:
    with start_gateway(prefix_mode="upstream") as gw, Rollout(gw.url, task_input={}) as rollout:
        with pytest.raises(openai.BadRequestError):
            rollout.openai_client(max_retries=0).chat.completions.create(
                model=MODEL, messages=[], max_tokens=3)
        with pytest.raises(anthropic.BadRequestError):
            rollout.anthropic_client(max_retries=0).messages.create(model=MODEL, max_tokens=3, messages=[])
