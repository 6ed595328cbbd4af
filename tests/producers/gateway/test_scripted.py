"""Scripted outputs (issue 18): a rollout started with ``script`` makes the embedded engine emit the given
completions in order, one per call, so a real harness can be driven down a known path (tool calls it
executes). The tokens are the script's, their logprobs the model's own (RAW), and every record says
``scripted``, so nothing trains on them. Once the script runs out, the engine samples again."""

from __future__ import annotations

import json

import numpy as np
import openai

from models.reference.task import LOOKUP_TOOL, task_messages
from producers.sdk import Rollout
from tokentrail.settings import Settings

from .helpers import engine_logprobs, output_of, prompts_of, read_records

MODEL = "tokentrail-tiny"
TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "fox"}}\n</tool_call>'
ANSWER = "The value of fox is red."


def test_a_scripted_rollout_drives_tool_calls_with_the_models_own_logprobs(
        start_gateway, topics: dict[str, str], tokentrail_settings: Settings, reference_model, text_side) -> None:
    with start_gateway() as gw, Rollout(gw.url, task_input={"key": "fox"}, script=[TOOL_CALL, ANSWER]) as rollout:
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key=rollout.api_key, max_retries=0)
        messages = task_messages("fox")
        first = client.chat.completions.create(model=MODEL, messages=messages, tools=[LOOKUP_TOOL], max_tokens=64)
        (call,) = first.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("lookup", {"key": "fox"})
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "red"}]
        second = client.chat.completions.create(model=MODEL, messages=messages, tools=[LOOKUP_TOOL], max_tokens=64,
                                                stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in second if chunk.choices)
        assert text == ANSWER and second.response.status_code == 200
        sampled = client.chat.completions.create(model=MODEL, messages=task_messages("owl"), max_tokens=4, seed=3)
        assert sampled.choices[0].message is not None
    calls = sorted((r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 3)),
                   key=lambda r: r["call_index"])
    assert [c["scripted"] for c in calls] == [True, True, False]
    assert all(c["status"] == "OK" for c in calls)
    for call, prompt, script in zip(calls[:2], prompts_of(calls)[:2], [TOOL_CALL, ANSWER], strict=True):
        ids, logprobs = output_of(call)
        assert text_side.decode(ids.tolist()) == script + "<|im_end|>" or text_side.decode(ids.tolist()) == script
        assert call["logprob_kind"] == "RAW"  # scripted tokens carry the model's RAW logprobs
        np.testing.assert_allclose(logprobs, engine_logprobs(reference_model, call, prompt), rtol=1e-4, atol=1e-4)
