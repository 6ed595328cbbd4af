"""Each model family behind a real gateway on the embedded engine, driven by the real ``openai`` and
``anthropic`` SDKs with scripted outputs in the family's own format (a random-weight model emits garbage):
tool calls (parallel where the format has them), reasoning, streaming, a tool-call markup the family's
parser cannot parse; the records are read back from Kafka and their prompt ids checked."""

from __future__ import annotations

import functools
import json
from typing import Any

import anthropic
import openai
import orjson
import pytest

from processors.assembler import RolloutAssembly
from producers.sdk import Rollout
from tests.producers.gateway.checks import prefix_holds
from tests.producers.gateway.helpers import output_of, prompts_of, read_records
from tokentrail.settings import Settings

from .family_models import family_dir, family_text_side

# Builds the four families once per machine (tens of seconds cold) and serves them: the e2e tier.
pytestmark = pytest.mark.e2e

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look up the value of a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
ANTHROPIC_LOOKUP = {"name": "lookup", "description": "Look up the value of a key.",
                    "input_schema": LOOKUP["function"]["parameters"]}


def _qwen_call(key: str) -> str:
    return f'<tool_call>\n{{"name": "lookup", "arguments": {{"key": "{key}"}}}}\n</tool_call>'


def _coder_call(key: str) -> str:
    return f"<tool_call>\n<function=lookup>\n<parameter=key>\n{key}\n</parameter>\n</function>\n</tool_call>"


# Per family: the scripted tool-call turn, the answer turn, broken markup, what each parses to, and whether
# the family's template renders a sampled turn back exactly (the splice holds across the tool round trip).
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": {
        "calls": "<think>\nI need both keys.\n</think>\n\n" + _qwen_call("fox") + "\n" + _qwen_call("owl"),
        "keys": ["fox", "owl"], "reasoning": ["I need both keys.", "Both found."],
        "answer": "<think>\nBoth found.\n</think>\n\nThe fox is red and the owl is grey.",
        "content": "The fox is red and the owl is grey.",
        "broken": '<tool_call>\n{"name": "lookup", "arguments": {"key": \n</tool_call>',
        "splice_holds": True,
    },
    "qwen3-coder": {
        "calls": _coder_call("fox") + "\n" + _coder_call("owl"),
        "keys": ["fox", "owl"], "reasoning": [None, None],
        "answer": "The fox is red and the owl is grey.", "content": "The fox is red and the owl is grey.",
        "broken": "<tool_call>\n<function=lookup>\n<parameter=key>\nfox\n</parameter>\n",
        "splice_holds": True,
    },
    "llama3": {  # Llama 3.1's template takes one tool call per turn
        "calls": '{"name": "lookup", "parameters": {"key": "fox"}}',
        "keys": ["fox"], "reasoning": [None, None],
        "answer": "The fox is red.", "content": "The fox is red.",
        "broken": '{"name": "lookup", "parameters": {"key": ',
        "splice_holds": True,
    },
    "gpt-oss": {  # harmony: one tool call per turn; rendered by openai-harmony, spliced at message boundaries
        "calls": "<|channel|>analysis<|message|>I need the fox.<|end|><|start|>assistant<|channel|>commentary "
                 'to=functions.lookup <|constrain|>json<|message|>{"key": "fox"}<|call|>',
        "keys": ["fox"], "reasoning": ["I need the fox.", "Found it."],
        "answer": "<|channel|>analysis<|message|>Found it.<|end|><|start|>assistant<|channel|>final<|message|>"
                  "The fox is red.<|return|>",
        "content": "The fox is red.",
        "broken": "The fox<|return|>",  # no harmony header: vLLM answers the raw text as content
        "splice_holds": True,
    },
}


@functools.cache
def _gpt_oss_judge() -> Any:
    """renderers' gpt-oss renderer (harmony's encoder under renderers' own conversion): not the gateway's code."""
    from conformance.formats import FORMATS
    from tokentrail.commands.conformance import independent_renderer

    return independent_renderer(FORMATS["gpt-oss"], family_dir("gpt-oss"))


def _calls(settings: Settings, topic: str, rollout: Rollout, n: int) -> list[dict[str, Any]]:
    found = [r for _, r in read_records(settings, topic, n, where={"rollout_id": rollout.rollout_id})]
    return sorted(found, key=lambda r: r["call_index"])


def _check_prompts(calls: list[dict[str, Any]], family: str, conversations: list[Any], scripts: list[str]) -> list[Any]:
    """Each recorded prompt is exactly the family template's text for the request (decoded), and where
    nothing was spliced exactly its tokenization; each output is the script's tokens."""
    text = family_text_side(family)
    prompts = prompts_of(calls)
    previous: tuple[list[int], list[int]] | None = None
    for call, prompt, (messages, tools), script in zip(calls, prompts, conversations, scripts, strict=True):
        assert call["status"] == "OK" and call["scripted"] is True
        v = call["versions"]
        assert (v["tokenizer_fingerprint"], v["chat_template_fingerprint"]) == (
            text.tokenizer_fingerprint, text.chat_template_fingerprint)
        if family == "gpt-oss":  # harmony's ids; a spliced prompt as renderers' bridge over the sampled ids
            if call["spliced_outputs"] == 0:
                assert prompt.tolist() == text.harmony.render(messages, tools)
            else:
                assert previous is not None
                assert _gpt_oss_judge().judge(prompt.tolist(), messages, tools, previous).how == "bridge"
        else:
            rendered = text.render_text(messages, tools)
            assert text.renderer.decode(prompt.tolist()) == rendered
            if call["spliced_outputs"] == 0:
                assert prompt.tolist() == text.renderer.encode(rendered)
        previous = (prompt.tolist(), output_of(call)[0].tolist())
        ids, logprobs = output_of(call)
        assert text.renderer.decode(ids.tolist()) in (script, script + text.renderer.decode([text.stop_token_ids[0]]))
        assert len(logprobs) == len(ids)
    return prompts


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_openai_chat_on_a_family(start_family_gateway, topics: dict[str, str], tokentrail_settings: Settings,
                                 family: str) -> None:
    spec = FAMILIES[family]
    text = family_text_side(family)
    tools = [LOOKUP]
    # Qwen3-Coder (whose broken XML calls peers drop silently) also retries with a good call after the broken one.
    retry = family == "qwen3-coder"
    scripts = [spec["calls"], spec["answer"], spec["broken"], *[spec["calls"]] * retry]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Answer with the lookup tool."},
                                      {"role": "user", "content": "What are fox and owl?"}]
    conversations = []
    with start_family_gateway(family) as gw, \
            Rollout(gw.url, task_input={}, script=scripts) as rollout:
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key=rollout.api_key, max_retries=0)
        conversations.append(([dict(m) for m in messages], tools))
        first = client.chat.completions.create(model=family, messages=messages, tools=tools, max_tokens=64,
                                               parallel_tool_calls=True)
        message = first.choices[0].message
        assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
            ("lookup", {"key": k}) for k in spec["keys"]]
        assert first.choices[0].finish_reason == "tool_calls"
        assert (message.model_extra or {}).get("reasoning_content") == spec["reasoning"][0]
        messages.append(message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": f"{c.function.arguments} is red"}
                     for c in message.tool_calls]
        conversations.append(([dict(m) for m in messages], tools))
        stream = client.chat.completions.create(model=family, messages=messages, tools=tools, max_tokens=64,
                                                stream=True)
        deltas = [c.choices[0].delta for c in stream if c.choices]
        content = "".join(d.content or "" for d in deltas)
        reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
        assert content == spec["content"] and (reasoning or None) == spec["reasoning"][1]
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "And the cat?"}]
        conversations.append(([dict(m) for m in messages], tools))
        broken = client.chat.completions.create(model=family, messages=messages, tools=tools, max_tokens=64)
        if retry:  # the harness retries after the unparsed answer: the good call after it parses as ever
            messages += [{"role": "assistant", "content": broken.choices[0].message.content},
                         {"role": "user", "content": "Use the tool."}]
            conversations.append(([dict(m) for m in messages], tools))
            again = client.chat.completions.create(model=family, messages=messages, tools=tools, max_tokens=64)
            assert [(c.function.name, json.loads(c.function.arguments))
                    for c in again.choices[0].message.tool_calls] == [("lookup", {"key": k}) for k in spec["keys"]]
    # Unparseable tool-call markup: answered as vLLM's parser answers it (all text as content, no calls).
    expected_broken = text.parse(text.decode(text.renderer.encode(spec["broken"])))
    assert broken.choices[0].message.tool_calls is None and broken.choices[0].finish_reason == "stop"
    assert broken.choices[0].message.content == expected_broken.content and expected_broken.errors
    # The errors say what failed, never the output's text (they are not sealed with the content).
    tail = expected_broken.content.strip()[-10:]
    assert tail and not any(tail in error for error in expected_broken.errors), expected_broken.errors

    calls = _calls(tokentrail_settings, topics["calls_topic"], rollout, len(scripts))
    prompts = _check_prompts(calls, family, conversations, scripts)
    for call in calls:  # the record names the family and the library that parsed
        assert call["versions"]["parser_version"].startswith(f"{family}: ")
    assert prefix_holds(calls, prompts, 0) is spec["splice_holds"]
    if not spec["splice_holds"]:
        assert any(b.startswith(f"{family} format: ") for b in calls[1]["prefix_breaks"])
    if family == "gpt-oss":  # after a final answer harmony drops its analysis and ends it <|end|>: named
        assert not prefix_holds(calls, prompts, 1)
        assert calls[2]["prefix_breaks"] == [
            "call 0, message 2: harmony does not keep the sampled turn (reasoning_dropped)",
            "call 1, message 4: harmony does not keep the sampled turn (reasoning_dropped, turn_end_rewritten)",
            "gpt-oss format: reasoning_dropped, turn_end_rewritten"]
    extra = json.loads(calls[2]["sampling"]["extra_json"])
    assert extra["parse_errors"] == list(expected_broken.errors)
    assert "parse_errors" not in json.loads(calls[0]["sampling"]["extra_json"])
    # The assembled rollout names the call that failed to parse, for the credit's parse_failures policy.
    env = read_records(tokentrail_settings, topics["env_topic"], 2, where={"rollout_id": rollout.rollout_id})
    assembly = RolloutAssembly(rollout.rollout_id)
    events = [*env, *(("CallRecord", c) for c in calls)]
    (assembled,) = [out for name, rec in events for out in assembly.accept(name, rec).rollouts]
    assert [c["parse_failures"] for c in assembled["calls"]] == [0, 0, len(expected_broken.errors), *[0] * retry]


def _anthropic_history(first: Any) -> list[dict[str, Any]]:
    return [b.model_dump(exclude_none=True) for b in first.content]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_anthropic_messages_on_a_family(start_family_gateway, topics: dict[str, str],
                                        tokentrail_settings: Settings, family: str) -> None:
    spec = FAMILIES[family]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What are fox and owl?"}]
    with start_family_gateway(family) as gw, \
            Rollout(gw.url, task_input={}, script=[spec["calls"], spec["answer"]]) as rollout:
        client = anthropic.Anthropic(base_url=gw.url, api_key=rollout.api_key, max_retries=0)
        first = client.messages.create(model=family, system="Answer with the lookup tool.", messages=messages,
                                       tools=[ANTHROPIC_LOOKUP], max_tokens=64)
        uses = [b for b in first.content if b.type == "tool_use"]
        assert first.stop_reason == "tool_use" and [u.input for u in uses] == [{"key": k} for k in spec["keys"]]
        thinking = [b.thinking for b in first.content if b.type == "thinking"]
        assert thinking == ([spec["reasoning"][0]] if spec["reasoning"][0] else [])
        messages += [{"role": "assistant", "content": _anthropic_history(first)},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "red"}
                                                  for u in uses]}]
        with client.messages.stream(model=family, system="Answer with the lookup tool.", messages=messages,
                                    tools=[ANTHROPIC_LOOKUP], max_tokens=64) as events:
            second = events.get_final_message()
        assert second.stop_reason == "end_turn"
        assert [b.text for b in second.content if b.type == "text"] == [spec["content"]]
    calls = _calls(tokentrail_settings, topics["calls_topic"], rollout, 2)
    assert [c["status"] for c in calls] == ["OK", "OK"]
    assert all(c["protocol"] == "anthropic.messages" for c in calls)
    assert all(c["versions"]["parser_version"] == family_text_side(family).parser_version for c in calls)
    # The tool_use turn re-entered as the exact sampled ids wherever the family's template allows it.
    assert (calls[1]["spliced_outputs"] == 1) is spec["splice_holds"]
    request = orjson.loads(calls[1]["request_json"])
    assert request["body"]["messages"][1]["role"] == "assistant"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_responses_on_a_family(start_family_gateway, topics: dict[str, str], tokentrail_settings: Settings,
                               family: str) -> None:
    spec = FAMILIES[family]
    tool = {"type": "function", **LOOKUP["function"]}  # the Responses API's flat function tool
    common = {"instructions": "Answer with the lookup tool.", "tools": [tool], "max_output_tokens": 64}
    with start_family_gateway(family) as gw, \
            Rollout(gw.url, task_input={}, script=[spec["calls"], spec["answer"]]) as rollout:
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key=rollout.api_key, max_retries=0)
        first = client.responses.create(model=family, input="What are fox and owl?", store=False, **common)
        calls = [i for i in first.output if i.type == "function_call"]
        assert [json.loads(c.arguments) for c in calls] == [{"key": k} for k in spec["keys"]]
        assert any(i.type == "reasoning" for i in first.output) is (spec["reasoning"][0] is not None)
        history = [{"role": "user", "content": [{"type": "input_text", "text": "What are fox and owl?"}]},
                   *[item.model_dump(exclude_none=True) for item in first.output],
                   *[{"type": "function_call_output", "call_id": c.call_id, "output": "red"} for c in calls]]
        events = list(client.responses.create(model=family, input=history, stream=True, **common))
        done = next(e for e in events if e.type == "response.completed").response
        assert done.output_text == spec["content"]
    records = _calls(tokentrail_settings, topics["calls_topic"], rollout, 2)
    assert [r["protocol"] for r in records] == ["openai.responses"] * 2
    assert all(r["versions"]["parser_version"].startswith(f"{family}: ") for r in records)
    assert (records[1]["spliced_outputs"] == 1) is spec["splice_holds"]
