"""OpenAI Chat Completions and Completions requests the gateway must refuse (or serve) in OpenAI's error shape."""

from __future__ import annotations

from typing import Any

import orjson

# Short local names: each row of the tables below states its expected answer with one of them.
from reliability.bad_inputs.http_case import HttpCase, HttpExpect
from reliability.bad_inputs.http_case import openai_error as oa
from reliability.bad_inputs.limits import CORPUS_MAX_TOKENS, HUGE, LONG_FOR_THE_RECORD


def openai_cases(model: str) -> list[HttpCase]:
    chat = "/v1/chat/completions"
    user = [{"role": "user", "content": "hi"}]

    def c(id_: str, klass: str, what: str, expect: HttpExpect, body: Any = None, *, raw: bytes | None = None,
          path: str = chat, method: str = "POST", headers: dict[str, str] | None = None,
          gap: str | None = None) -> HttpCase:
        return HttpCase(f"openai.{id_}", "openai", klass, what, path, expect, body, raw, method,
                        dict(headers or {}), gap)

    def req(**fields: Any) -> dict[str, Any]:
        return {"model": model, "messages": user, "max_tokens": 2, **fields}

    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    return [
        c("json.truncated", "malformed JSON", "body cut mid-object", oa(400, "invalid_json"), raw=b'{"model": '),
        c("json.trailing", "malformed JSON", "garbage after the object", oa(400, "invalid_json"),
          raw=b'{"model": "m"} xyz'),
        c("json.empty", "malformed JSON", "empty body", oa(400, "invalid_json"), raw=b""),
        c("json.array", "malformed JSON", "top-level array", oa(400, "invalid_json"), [1, 2]),
        c("json.string", "malformed JSON", "top-level string", oa(400, "invalid_json"), "hi"),
        c("json.nan_literal", "malformed JSON", "NaN literal (not JSON)", oa(400, "invalid_json"),
          raw=b'{"model": "m", "messages": [], "temperature": NaN}'),
        c("json.single_quotes", "malformed JSON", "single-quoted keys", oa(400, "invalid_json"),
          raw=b"{'model': 'm'}"),
        c("utf8.invalid_bytes", "non-UTF-8", "0xff 0xfe inside a string", oa(400, "invalid_encoding"),
          raw=b'{"model": "\xff\xfe"}'),
        c("utf8.latin1", "non-UTF-8", "latin-1 encoded body", oa(400, "invalid_encoding"),
          raw='{"model": "caf\u00e9"}'.encode("latin-1")),
        c("utf8.utf16", "non-UTF-8", "UTF-16 encoded JSON", oa(400, "invalid_encoding"),
          raw=orjson.dumps(req()).decode().encode("utf-16")),
        c("huge.content", "huge body", "one message over the body limit", oa(413, "request_too_large"),
          req(messages=[{"role": "user", "content": HUGE}])),
        c("huge.record", "huge record", "a body under the limit whose call record is over Kafka's: answered, "
          "the whole record quarantined, a stand-in on Kafka, the calls after it flow",
          oa(200), req(messages=[{"role": "user", "content": LONG_FOR_THE_RECORD}])),
        c("context.full", "no room for output", "a prompt that fills the model's context",
          oa(400, "context_length_exceeded", "prompt", contains="no room for output"),
          {"model": model, "prompt": [5] * 8192, "max_tokens": 2}, path="/v1/completions"),
        c("huge.many_messages", "huge body", "thousands of small messages",
          oa(413, "request_too_large"), req(messages=[{"role": "user", "content": "0123456789"}] * 4000)),
        c("missing.model", "missing field", "no model", oa(400, param="model"), {"messages": user}),
        c("missing.messages", "missing messages", "no messages", oa(400, param="messages"), {"model": model}),
        c("empty.messages", "missing messages", "messages = []", oa(400, param="messages"), req(messages=[])),
        c("empty.model", "missing field", "model = ''", oa(400, param="model"), req(model="")),
        c("type.messages", "wrong type", "messages is a string", oa(400, param="messages"), req(messages="hi")),
        c("type.model", "wrong type", "model is a number", oa(400, param="model"), req(model=5)),
        c("type.max_tokens", "wrong type", "max_tokens is a word", oa(400, param="max_tokens"),
          req(max_tokens="ten")),
        c("type.stream", "wrong type", "stream is 'maybe'", oa(400, param="stream"), req(stream="maybe")),
        c("type.content", "wrong type", "content is a number", oa(400, contains="messages.0.content"),
          req(messages=[{"role": "user", "content": 42}])),
        c("type.stop", "wrong type", "stop is a number", oa(400, contains="stop"), req(stop=5)),
        c("model.unknown", "unknown model", "model gpt-9", oa(404, "model_not_found", "model"), req(model="gpt-9")),
        # Harnesses ask for their vendor model's budget (Pi 16384, Claude Code 64000): served with what fits.
        c("max_tokens.over_limit", "max_tokens too large", "one over the gateway limit: served with the limit",
          oa(200), req(max_tokens=CORPUS_MAX_TOKENS + 1)),
        c("max_tokens.completion_huge", "max_tokens too large", "max_completion_tokens 100000: served with "
          "what fits", oa(200), {"model": model, "messages": user, "max_completion_tokens": 100_000}),
        c("max_tokens.zero", "max_tokens too large", "max_tokens 0", oa(400, param="max_tokens"), req(max_tokens=0)),
        c("max_tokens.negative", "max_tokens too large", "max_tokens -5", oa(400, param="max_tokens"),
          req(max_tokens=-5)),
        c("role.unknown", "bad role", "role 'wizard'", oa(400, param="messages.0.role"),
          req(messages=[{"role": "wizard", "content": "x"}])),
        c("role.missing", "bad role", "message without role", oa(400, param="messages.0.role"),
          req(messages=[{"content": "x"}])),
        c("role.tool_without_id", "bad role", "tool message lacks tool_call_id",
          oa(400, param="messages.1.tool_call_id"),
          req(messages=[*user, {"role": "tool", "content": "42"}])),
        c("content.image", "bad role", "image content part (text-only model)",
          oa(400, param="messages.0.content.0.type"),
          req(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}])),
        c("tools.not_list", "bad tool schema", "tools is a string", oa(400, param="tools"), req(tools="lookup")),
        c("tools.no_function", "bad tool schema", "function tool without function",
          oa(400, param="tools.0.function"), req(tools=[{"type": "function"}])),
        c("tools.empty_name", "bad tool schema", "function name ''", oa(400, contains="tools.0.function.name"),
          req(tools=[{"type": "function", "function": {"name": ""}}])),
        c("tools.parameters_string", "bad tool schema", "parameters is a string",
          oa(400, contains="tools.0.function.parameters"),
          req(tools=[{"type": "function", "function": {"name": "f", "parameters": "object"}}])),
        c("tools.wrong_type", "bad tool schema", "tool type 'retrieval'", oa(400, contains="tools.0.type"),
          req(tools=[{"type": "retrieval", "function": {"name": "f"}}])),
        c("tool_choice.word", "bad tool_choice", "tool_choice 'sometimes'", oa(400, contains="tool_choice"),
          req(tools=[tool], tool_choice="sometimes")),
        c("tool_choice.number", "bad tool_choice", "tool_choice 5", oa(400, contains="tool_choice"),
          req(tools=[tool], tool_choice=5)),
        c("tool_choice.unknown_function", "bad tool_choice", "forces a function that is not in tools",
          oa(400, contains="tool_choice"),
          req(tools=[tool], tool_choice={"type": "function", "function": {"name": "missing"}}),
          gap="accepted (200): a named tool_choice is not checked against tools"),
        c("temperature.negative", "bad sampling", "temperature -0.5", oa(400, param="temperature"),
          req(temperature=-0.5)),
        c("temperature.nan", "bad sampling", "temperature 'NaN'", oa(400, param="temperature"),
          req(temperature="NaN")),
        c("temperature.infinity", "bad sampling", "temperature 'Infinity'", oa(400, param="temperature"),
          req(temperature="Infinity")),
        c("temperature.too_high", "bad sampling", "temperature 3.5", oa(400, param="temperature"),
          req(temperature=3.5)),
        c("top_p.zero", "bad sampling", "top_p 0", oa(400, param="top_p"), req(top_p=0)),
        c("top_p.above_one", "bad sampling", "top_p 1.5", oa(400, param="top_p"), req(top_p=1.5)),
        c("n.two", "bad sampling", "n 2 (one output per record)", oa(400, param="n"), req(n=2)),
        c("top_logprobs.50", "bad sampling", "top_logprobs 50", oa(400, param="top_logprobs"),
          req(logprobs=True, top_logprobs=50)),
        c("presence_penalty.5", "bad sampling", "presence_penalty 5", oa(400, param="presence_penalty"),
          req(presence_penalty=5)),
        c("route.get", "bad route", "GET on a POST route", oa(405), method="GET"),
        c("route.unknown", "bad route", "unknown path", oa(404), req(), path="/v1/nothing"),
        c("completions.no_prompt", "missing field", "completion without prompt", oa(400, param="prompt"),
          {"model": model, "max_tokens": 2}, path="/v1/completions"),
        c("completions.token_out_of_vocab", "wrong type", "token id 10**9", oa(400, "invalid_token_id", "prompt"),
          {"model": model, "prompt": [10**9], "max_tokens": 2}, path="/v1/completions"),
        c("completions.two_prompts", "wrong type", "a batch of two prompts", oa(400, param="prompt"),
          {"model": model, "prompt": ["a", "b"], "max_tokens": 2}, path="/v1/completions"),
        c("completions.echo", "wrong type", "echo true (unsupported)", oa(400, param="echo"),
          {"model": model, "prompt": "a", "max_tokens": 2, "echo": True}, path="/v1/completions"),
        c("completions.suffix", "wrong type", "suffix (unsupported)", oa(400, param="suffix"),
          {"model": model, "prompt": "a", "max_tokens": 2, "suffix": "z"}, path="/v1/completions"),
        c("completions.logprobs_9", "bad sampling", "logprobs 9 (max 5)", oa(400, param="logprobs"),
          {"model": model, "prompt": "a", "max_tokens": 2, "logprobs": 9}, path="/v1/completions"),
        c("completions.prompt_number", "wrong type", "prompt is a bare number", oa(400, contains="prompt"),
          {"model": model, "prompt": 5, "max_tokens": 2}, path="/v1/completions"),
        c("identity.unknown_rollout", "unknown rollout", "attempt path of a rollout nobody started",
          oa(404, "unknown_rollout"), req(), path="/rollouts/never-started/attempts/a0/v1/chat/completions"),
        c("identity.finished_attempt", "events after finish", "a call on a finished attempt",
          oa(409, "attempt_finished"), req(), path="/rollouts/{done}/v1/chat/completions"),
        c("identity.unknown_header_rollout", "unknown rollout", "X-Rollout-Id of a rollout nobody started",
          oa(404, "unknown_rollout"), req(), headers={"X-Rollout-Id": "never-started", "X-Attempt-Id": "a0"}),
    ]
