"""The official openai SDK's Responses API against a real gateway on the embedded engine; records read back
from Kafka."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import openai
import orjson
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from models.reference.task import LOOKUP_TOOL, task_messages
from producers.gateway import responses_adapter
from producers.gateway.body import validate
from producers.gateway.chat import CallOutcome, ToolCallOut
from producers.gateway.models_responses import ResponsesRequest
from producers.sdk import Rollout
from tokentrail.settings import Settings

from .checks import prefix_holds
from .helpers import engine_logprobs, output_of, prompts_of, read_records

MODEL = "tokentrail-tiny"
TOOL = {"type": "function", **LOOKUP_TOOL["function"]}  # the Responses API's flat function tool
STREAM_EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


def _strict(event: Any) -> Any:
    """Validate an event the SDK built (it constructs without checking) against its own types."""
    return STREAM_EVENTS.validate_python(event.to_dict())


def respond(client: openai.OpenAI, stream: bool, **kwargs: Any) -> Response:
    """One call; for a stream, checks the events and returns the response of ``response.completed``."""
    if not stream:
        return client.responses.create(model=MODEL, **kwargs)
    events = [_strict(e) for e in client.responses.create(model=MODEL, stream=True, **kwargs)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    final = events[-1].response
    assert final.usage is not None and final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens
    deltas: dict[str, str] = {}
    done: dict[str, str] = {}
    for e in events:
        if e.type in ("response.output_text.delta", "response.function_call_arguments.delta"):
            deltas[e.item_id] = deltas.get(e.item_id, "") + e.delta
        elif e.type == "response.output_text.done":
            done[e.item_id] = e.text
        elif e.type == "response.function_call_arguments.done":
            done[e.item_id] = e.arguments
    assert deltas == done
    items_done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.id for i in items_done] == [i.id for i in final.output]
    for item in final.output:  # the final items carry exactly what was streamed
        if item.type == "message":
            assert item.content[0].text == deltas.get(item.id, "")
        elif item.type == "function_call":
            assert item.arguments == deltas[item.id]
    return final


def _message_text(response: Response) -> str:
    return "".join(p.text for i in response.output if i.type == "message" for p in i.content)


def _calls(response: Response) -> list[tuple[str, dict[str, Any]]]:
    return [(i.name, json.loads(i.arguments)) for i in response.output if i.type == "function_call"]


@pytest.mark.parametrize(("stream", "prefix_mode"), [(False, "splice"), (True, "retokenize")])
def test_tool_conversation_is_recorded_token_exact(
    start_gateway, topics: dict[str, str], text_side, reference_model, tokentrail_settings: Settings,
    stream: bool, prefix_mode: str,
) -> None:
    system, user = task_messages("fox")
    with start_gateway(prefix_mode=prefix_mode) as gw, Rollout(gw.url, task_input={"key": "fox"}) as rollout:
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key="harness-key")
        common = {"instructions": system["content"], "tools": [TOOL], "temperature": 0.0, "max_output_tokens": 40}
        # Greedy: the warmed-up model calls the lookup tool for the asked key.
        first = respond(client, stream, input=user["content"], metadata={"task": "lookup"}, store=False,
                        parallel_tool_calls=False, tool_choice="auto", **common)
        assert first.status == "completed" and first.metadata == {"task": "lookup"}
        (call,) = [i for i in first.output if i.type == "function_call"]
        assert call.name == "lookup" and set(json.loads(call.arguments)) == {"key"} and call.call_id
        # Turn two: the harness sends back the whole conversation, output items and the tool's result.
        history = [{"role": "user", "content": [{"type": "input_text", "text": user["content"]}]},
                   *[item.model_dump(exclude_none=True) for item in first.output],
                   {"type": "function_call_output", "call_id": call.call_id, "output": "red"}]
        second = respond(client, stream, input=history, **common)
        assert second.status == "completed" and _message_text(second) and not _calls(second)
        assert second.output_text == _message_text(second)
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens

    calls = [r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 2,
                                        where={"rollout_id": rollout.rollout_id})]
    assert [c["call_index"] for c in calls] == [0, 1]
    assert all(c["protocol"] == "openai.responses" and c["streamed"] is stream and c["status"] == "OK"
               and c["prefix_mode"] == prefix_mode for c in calls)
    assert calls[0]["sampling"]["temperature"] == 0.0 and calls[0]["sampling"]["max_tokens"] == 40
    tools = [LOOKUP_TOOL]
    first_turn = [system, user]
    assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]}
    conversations = [first_turn, [*first_turn, assistant, {"role": "tool", "tool_call_id": call.call_id,
                                                           "content": "red"}]]
    prompts = prompts_of(calls)
    for i, (record, prompt, returned) in enumerate(zip(calls, prompts, [first, second], strict=True)):
        # The recorded prompt is what the template renders for the converted request; re-encoding the
        # conversation reproduces its ids (in splice mode the later prompt reuses sampled ids instead).
        assert text_side.renderer.decode(prompt.tolist()) == text_side.render_text(conversations[i], tools)
        if i == 0 or prefix_mode == "retokenize":
            assert prompt.tolist() == text_side.renderer.render(conversations[i], tools)
        assert len(prompt) == returned.usage.input_tokens
        # The sampled ids decode to exactly what the SDK was told.
        output_ids, logprobs = output_of(record)
        assert len(output_ids) == len(logprobs) == returned.usage.output_tokens
        parsed = text_side.parse(text_side.decode(output_ids.tolist()))
        assert parsed.content == _message_text(returned)
        assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == _calls(returned)
        np.testing.assert_allclose(logprobs, engine_logprobs(reference_model, record, prompt), atol=2e-3, rtol=0)
        recorded = orjson.loads(record["response_json"])
        assert recorded["id"] == returned.id and recorded["output"][-1]["id"] == returned.output[-1].id
    if prefix_mode == "splice":
        assert prefix_holds(calls, prompts, 0)
        assert calls[1]["spliced_outputs"] >= 1 and calls[1]["prefix_breaks"] == []
        assert calls[1]["prompt"]["base_call_id"] == calls[0]["call_id"]
    request = orjson.loads(calls[1]["request_json"])
    assert request["body"]["input"][-1] == {"type": "function_call_output", "call_id": call.call_id,
                                            "output": "red"}
    assert request["path"].endswith("/v1/responses") and request["headers"]["authorization"] == "[redacted]"


def test_refusals_in_openai_error_shape(start_gateway) -> None:
    with start_gateway() as gw:
        client = openai.OpenAI(base_url=gw.openai_base_url, api_key="k", max_retries=0)
        cases: list[tuple[dict[str, Any], str, str]] = [
            ({"input": "hi", "previous_response_id": "resp_123"}, "previous_response_id",
             "send the full conversation"),
            ({"input": "hi", "tools": [{"type": "file_search"}]}, "tools.0.type", "'file_search' is not supported"),
            ({"input": [{"type": "function_call", "name": "lookup"}], "stream": True}, "input.0.function_call.call_id",
             "Field required"),
            ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type", "'item_reference' is not"),
            ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
             "input.0.content.0.type", "'input_image' is not supported"),
        ]
        for kwargs, param, message in cases:
            with pytest.raises(openai.BadRequestError) as caught:
                client.responses.create(model=MODEL, **kwargs)
            body = caught.value.response.json()
            assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
            assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == param
            assert message in body["error"]["message"], body
        refused = gw.gateway.metrics.refused.labels(responses_adapter.PROTOCOL, "400")._value.get()
        assert refused == len(cases)  # refused before the call got an index: nothing recorded


def test_stream_frames_validate_against_the_sdk_types() -> None:
    """Reasoning, text and a function call in one stream (the tiny model rarely reasons): every frame is
    a valid SDK event, and the final response equals the unstreamed body. Sending that output back as
    input makes one assistant turn, the form the gateway recorded."""
    req = validate(ResponsesRequest, {"model": MODEL, "input": "x", "tools": [TOOL]})
    outcome = CallOutcome("c1", 0, MODEL, 1, [1, 2], [3, 4], [-0.1, -0.2], "", "answer", "thought",
                          [ToolCallOut("call_abc", "lookup", '{"key": "fox"}')], "stop")
    fmt = responses_adapter.ResponseStream(req, "c1", 1)
    frames = fmt.start([1, 2]) + fmt.reasoning("tho") + fmt.reasoning("ught") + fmt.content("ans") \
        + fmt.content("wer") + fmt.finish(outcome)
    events = []
    for frame in frames:
        name, data = frame.decode().removesuffix("\n\n").split("\n")
        events.append(STREAM_EVENTS.validate_python(orjson.loads(data.removeprefix("data: "))))
        assert name == f"event: {events[-1].type}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    body = Response.model_validate(responses_adapter.response_body(outcome, req))
    assert events[-1].type == "response.completed" and events[-1].response.output == body.output
    assert [i.type for i in body.output] == ["reasoning", "message", "function_call"]

    again = validate(ResponsesRequest, {"model": MODEL, "input": [
        {"role": "user", "content": "q"}, *[i.model_dump(exclude_none=True) for i in body.output],
        {"type": "function_call_output", "call_id": "call_abc", "output": "red"}]})
    messages = responses_adapter.to_internal(again, 64).messages
    assert messages == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "answer", "reasoning_content": "thought",
         "tool_calls": [{"id": "call_abc", "type": "function",
                         "function": {"name": "lookup", "arguments": '{"key": "fox"}'}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "red"},
    ]
