"""An output whose tool-call markup the parser cannot parse, through the real gateway (issue 28's parse-failure
sample policy): the harness gets the text as content and no tool call, the call record names the parse error,
the assembled rollout says which call failed (``calls[].parse_failures``), and the good call after it parsed
and was answered as a tool call."""

from __future__ import annotations

import json

import openai

from models.reference.task import LOOKUP_TOOL, task_messages
from processors.assembler import RolloutAssembly
from processors.parse_failures import parse_failed_call_ids
from producers.sdk import Rollout
from tokentrail.settings import Settings

from .helpers import read_records

MODEL = "tokentrail-tiny"
BROKEN = '<tool_call>\n{"name": "lookup", "arguments": {"key": \n</tool_call>'
GOOD = '<tool_call>\n{"name": "lookup", "arguments": {"key": "fox"}}\n</tool_call>'


def test_a_call_that_fails_to_parse_is_named_on_the_rollout_and_the_next_call_still_parses(
        start_gateway, topics: dict[str, str], tokentrail_settings: Settings) -> None:
    with start_gateway() as gw, Rollout(gw.url, task_input={"key": "fox"}, script=[BROKEN, GOOD]) as rollout:
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key=rollout.api_key, max_retries=0)
        messages = task_messages("fox")
        broken = client.chat.completions.create(model=MODEL, messages=messages, tools=[LOOKUP_TOOL], max_tokens=64)
        assert broken.choices[0].message.tool_calls is None and broken.choices[0].finish_reason == "stop"
        assert broken.choices[0].message.content == BROKEN  # answered as content, as vLLM's hermes parser does
        messages += [{"role": "assistant", "content": BROKEN}, {"role": "user", "content": "Try again."}]
        good = client.chat.completions.create(model=MODEL, messages=messages, tools=[LOOKUP_TOOL], max_tokens=64)
        (call,) = good.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("lookup", {"key": "fox"})
    rid = rollout.rollout_id
    calls = read_records(tokentrail_settings, topics["calls_topic"], 2, where={"rollout_id": rid})
    env = read_records(tokentrail_settings, topics["env_topic"], 2, where={"rollout_id": rid})
    errors = {r["call_index"]: json.loads(r["sampling"]["extra_json"]).get("parse_errors") for _, r in calls}
    assert len(errors[0]) == 1 and "tool call" in errors[0][0] and errors[1] is None
    assembly = RolloutAssembly(rid)
    (assembled,) = [out for name, rec in [*env, *calls] for out in assembly.accept(name, rec).rollouts]
    assert assembled["status"] == "COMPLETE"
    assert [c["parse_failures"] for c in assembled["calls"]] == [1, 0]
    assert parse_failed_call_ids(assembled) == [assembled["calls"][0]["call_id"]]
