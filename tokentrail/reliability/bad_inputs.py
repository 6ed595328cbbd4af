"""The bad-input corpus: one table row per bad input, each stating what the system must answer.

Four kinds of case, each a frozen dataclass:

* ``HttpCase``   a request to the gateway (OpenAI, Anthropic or environment API) and the status and
                 error shape it must get back in the caller's protocol;
* ``TopicCase``  a record put on an input topic of the stream processors, and the dead-letter record
                 (stage, error type, reason) the worker must write — or, for prompt deltas that cannot
                 be rebuilt, the INCOMPLETE rollout naming the reason — plus what the ClickHouse sink
                 must dead-letter when it reads the same record;
* ``ConfigCase`` a configuration (reward / credit / sample / grouping YAML, a verifier spec) that must
                 be refused with a typed ``ConfigError`` whose message names the problem;
* ``VerifierCase`` a verifier that crashes, hangs or dies, whose Score must carry ERROR / TIMEOUT;
* ``SecurityCase`` a request to a gateway that requires keys: missing or wrong keys, another rollout's
                 key, management without the admin key, credentials that must be stored redacted, a
                 streamed body over the size limit.

``gap`` marks a case where the gateway's current answer is not the protocol's (the case states the
right answer; runners report these separately so they are seen, not hidden).

Placeholders in HttpCase paths: ``{live}`` is ``<rollout>/attempts/<attempt>`` of an attempt that
stays open during the corpus, ``{done}`` the same for an attempt finished before it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from schemas.codec import Codec

# The gateway the corpus runs against is started with these limits (small, so "huge" stays cheap).
CORPUS_MAX_BODY_BYTES = 64 * 1024
CORPUS_MAX_TOKENS = 64
# Kafka's record limit for that gateway's publisher: a body under the body limit can still make a record
# over it (its prompt ids, as issue 17's 5 MB request did under the 16 MiB default).
CORPUS_MAX_RECORD_BYTES = 24 * 1024
HUGE = "x" * (CORPUS_MAX_BODY_BYTES + 16 * 1024)
# Under the body limit and within the model's context (about 5,000 tokens), but its call record (about
# 26 kB) is over CORPUS_MAX_RECORD_BYTES.
LONG_FOR_THE_RECORD = " ".join(f"w{i}" for i in range(1200))

Shape = Literal["openai", "anthropic", "env"]
Record = dict[str, Any]


# ------------------------------------------------------------------------------------------ HTTP


@dataclass(frozen=True)
class HttpExpect:
    status: int
    shape: Shape
    code: str | None = None  # OpenAI / env error.code
    param: str | None = None  # OpenAI error.param
    error_type: str | None = None  # OpenAI error.type / Anthropic error.type / env error.type
    contains: str | None = None  # substring of the message


@dataclass(frozen=True)
class HttpCase:
    id: str
    area: Literal["openai", "anthropic", "env"]
    klass: str
    what: str
    path: str
    expect: HttpExpect
    body: Any = None  # sent as JSON unless ``raw`` is given
    raw: bytes | None = None
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    gap: str | None = None  # the gateway's current behaviour when it differs from ``expect``


def _oa(status: int, code: str | None = None, param: str | None = None, contains: str | None = None,
        error_type: str | None = None) -> HttpExpect:
    return HttpExpect(status, "openai", code, param, error_type, contains)


def _an(status: int, error_type: str = "invalid_request_error", contains: str | None = None) -> HttpExpect:
    return HttpExpect(status, "anthropic", error_type=error_type, contains=contains)


def _env(status: int, code: str | None = None, error_type: str | None = None,
         contains: str | None = None) -> HttpExpect:
    return HttpExpect(status, "env", code, None, error_type, contains)


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
        c("json.truncated", "malformed JSON", "body cut mid-object", _oa(400, "invalid_json"), raw=b'{"model": '),
        c("json.trailing", "malformed JSON", "garbage after the object", _oa(400, "invalid_json"),
          raw=b'{"model": "m"} xyz'),
        c("json.empty", "malformed JSON", "empty body", _oa(400, "invalid_json"), raw=b""),
        c("json.array", "malformed JSON", "top-level array", _oa(400, "invalid_json"), [1, 2]),
        c("json.string", "malformed JSON", "top-level string", _oa(400, "invalid_json"), "hi"),
        c("json.nan_literal", "malformed JSON", "NaN literal (not JSON)", _oa(400, "invalid_json"),
          raw=b'{"model": "m", "messages": [], "temperature": NaN}'),
        c("json.single_quotes", "malformed JSON", "single-quoted keys", _oa(400, "invalid_json"),
          raw=b"{'model': 'm'}"),
        c("utf8.invalid_bytes", "non-UTF-8", "0xff 0xfe inside a string", _oa(400, "invalid_encoding"),
          raw=b'{"model": "\xff\xfe"}'),
        c("utf8.latin1", "non-UTF-8", "latin-1 encoded body", _oa(400, "invalid_encoding"),
          raw='{"model": "caf\u00e9"}'.encode("latin-1")),
        c("utf8.utf16", "non-UTF-8", "UTF-16 encoded JSON", _oa(400, "invalid_encoding"),
          raw=orjson.dumps(req()).decode().encode("utf-16")),
        c("huge.content", "huge body", "one message over the body limit", _oa(413, "request_too_large"),
          req(messages=[{"role": "user", "content": HUGE}])),
        c("huge.record", "huge record", "a body under the limit whose call record is over Kafka's: answered, "
          "the whole record quarantined, a stand-in on Kafka, the calls after it flow",
          _oa(200), req(messages=[{"role": "user", "content": LONG_FOR_THE_RECORD}])),
        c("context.full", "no room for output", "a prompt that fills the model's context",
          _oa(400, "context_length_exceeded", "prompt", contains="no room for output"),
          {"model": model, "prompt": [5] * 8192, "max_tokens": 2}, path="/v1/completions"),
        c("huge.many_messages", "huge body", "thousands of small messages",
          _oa(413, "request_too_large"), req(messages=[{"role": "user", "content": "0123456789"}] * 4000)),
        c("missing.model", "missing field", "no model", _oa(400, param="model"), {"messages": user}),
        c("missing.messages", "missing messages", "no messages", _oa(400, param="messages"), {"model": model}),
        c("empty.messages", "missing messages", "messages = []", _oa(400, param="messages"), req(messages=[])),
        c("empty.model", "missing field", "model = ''", _oa(400, param="model"), req(model="")),
        c("type.messages", "wrong type", "messages is a string", _oa(400, param="messages"), req(messages="hi")),
        c("type.model", "wrong type", "model is a number", _oa(400, param="model"), req(model=5)),
        c("type.max_tokens", "wrong type", "max_tokens is a word", _oa(400, param="max_tokens"),
          req(max_tokens="ten")),
        c("type.stream", "wrong type", "stream is 'maybe'", _oa(400, param="stream"), req(stream="maybe")),
        c("type.content", "wrong type", "content is a number", _oa(400, contains="messages.0.content"),
          req(messages=[{"role": "user", "content": 42}])),
        c("type.stop", "wrong type", "stop is a number", _oa(400, contains="stop"), req(stop=5)),
        c("model.unknown", "unknown model", "model gpt-9", _oa(404, "model_not_found", "model"), req(model="gpt-9")),
        # Harnesses ask for their vendor model's budget (Pi 16384, Claude Code 64000): served with what fits.
        c("max_tokens.over_limit", "max_tokens too large", "one over the gateway limit: served with the limit",
          _oa(200), req(max_tokens=CORPUS_MAX_TOKENS + 1)),
        c("max_tokens.completion_huge", "max_tokens too large", "max_completion_tokens 100000: served with "
          "what fits", _oa(200), {"model": model, "messages": user, "max_completion_tokens": 100_000}),
        c("max_tokens.zero", "max_tokens too large", "max_tokens 0", _oa(400, param="max_tokens"), req(max_tokens=0)),
        c("max_tokens.negative", "max_tokens too large", "max_tokens -5", _oa(400, param="max_tokens"),
          req(max_tokens=-5)),
        c("role.unknown", "bad role", "role 'wizard'", _oa(400, param="messages.0.role"),
          req(messages=[{"role": "wizard", "content": "x"}])),
        c("role.missing", "bad role", "message without role", _oa(400, param="messages.0.role"),
          req(messages=[{"content": "x"}])),
        c("role.tool_without_id", "bad role", "tool message lacks tool_call_id",
          _oa(400, param="messages.1.tool_call_id"),
          req(messages=[*user, {"role": "tool", "content": "42"}])),
        c("content.image", "bad role", "image content part (text-only model)",
          _oa(400, param="messages.0.content.0.type"),
          req(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}])),
        c("tools.not_list", "bad tool schema", "tools is a string", _oa(400, param="tools"), req(tools="lookup")),
        c("tools.no_function", "bad tool schema", "function tool without function",
          _oa(400, param="tools.0.function"), req(tools=[{"type": "function"}])),
        c("tools.empty_name", "bad tool schema", "function name ''", _oa(400, contains="tools.0.function.name"),
          req(tools=[{"type": "function", "function": {"name": ""}}])),
        c("tools.parameters_string", "bad tool schema", "parameters is a string",
          _oa(400, contains="tools.0.function.parameters"),
          req(tools=[{"type": "function", "function": {"name": "f", "parameters": "object"}}])),
        c("tools.wrong_type", "bad tool schema", "tool type 'retrieval'", _oa(400, contains="tools.0.type"),
          req(tools=[{"type": "retrieval", "function": {"name": "f"}}])),
        c("tool_choice.word", "bad tool_choice", "tool_choice 'sometimes'", _oa(400, contains="tool_choice"),
          req(tools=[tool], tool_choice="sometimes")),
        c("tool_choice.number", "bad tool_choice", "tool_choice 5", _oa(400, contains="tool_choice"),
          req(tools=[tool], tool_choice=5)),
        c("tool_choice.unknown_function", "bad tool_choice", "forces a function that is not in tools",
          _oa(400, contains="tool_choice"),
          req(tools=[tool], tool_choice={"type": "function", "function": {"name": "missing"}}),
          gap="accepted (200): a named tool_choice is not checked against tools"),
        c("temperature.negative", "bad sampling", "temperature -0.5", _oa(400, param="temperature"),
          req(temperature=-0.5)),
        c("temperature.nan", "bad sampling", "temperature 'NaN'", _oa(400, param="temperature"),
          req(temperature="NaN")),
        c("temperature.infinity", "bad sampling", "temperature 'Infinity'", _oa(400, param="temperature"),
          req(temperature="Infinity")),
        c("temperature.too_high", "bad sampling", "temperature 3.5", _oa(400, param="temperature"),
          req(temperature=3.5)),
        c("top_p.zero", "bad sampling", "top_p 0", _oa(400, param="top_p"), req(top_p=0)),
        c("top_p.above_one", "bad sampling", "top_p 1.5", _oa(400, param="top_p"), req(top_p=1.5)),
        c("n.two", "bad sampling", "n 2 (one output per record)", _oa(400, param="n"), req(n=2)),
        c("top_logprobs.50", "bad sampling", "top_logprobs 50", _oa(400, param="top_logprobs"),
          req(logprobs=True, top_logprobs=50)),
        c("presence_penalty.5", "bad sampling", "presence_penalty 5", _oa(400, param="presence_penalty"),
          req(presence_penalty=5)),
        c("route.get", "bad route", "GET on a POST route", _oa(405), method="GET"),
        c("route.unknown", "bad route", "unknown path", _oa(404), req(), path="/v1/nothing"),
        c("completions.no_prompt", "missing field", "completion without prompt", _oa(400, param="prompt"),
          {"model": model, "max_tokens": 2}, path="/v1/completions"),
        c("completions.token_out_of_vocab", "wrong type", "token id 10**9", _oa(400, "invalid_token_id", "prompt"),
          {"model": model, "prompt": [10**9], "max_tokens": 2}, path="/v1/completions"),
        c("completions.two_prompts", "wrong type", "a batch of two prompts", _oa(400, param="prompt"),
          {"model": model, "prompt": ["a", "b"], "max_tokens": 2}, path="/v1/completions"),
        c("completions.echo", "wrong type", "echo true (unsupported)", _oa(400, param="echo"),
          {"model": model, "prompt": "a", "max_tokens": 2, "echo": True}, path="/v1/completions"),
        c("completions.suffix", "wrong type", "suffix (unsupported)", _oa(400, param="suffix"),
          {"model": model, "prompt": "a", "max_tokens": 2, "suffix": "z"}, path="/v1/completions"),
        c("completions.logprobs_9", "bad sampling", "logprobs 9 (max 5)", _oa(400, param="logprobs"),
          {"model": model, "prompt": "a", "max_tokens": 2, "logprobs": 9}, path="/v1/completions"),
        c("completions.prompt_number", "wrong type", "prompt is a bare number", _oa(400, contains="prompt"),
          {"model": model, "prompt": 5, "max_tokens": 2}, path="/v1/completions"),
        c("identity.unknown_rollout", "unknown rollout", "attempt path of a rollout nobody started",
          _oa(404, "unknown_rollout"), req(), path="/rollouts/never-started/attempts/a0/v1/chat/completions"),
        c("identity.finished_attempt", "events after finish", "a call on a finished attempt",
          _oa(409, "attempt_finished"), req(), path="/rollouts/{done}/v1/chat/completions"),
        c("identity.unknown_header_rollout", "unknown rollout", "X-Rollout-Id of a rollout nobody started",
          _oa(404, "unknown_rollout"), req(), headers={"X-Rollout-Id": "never-started", "X-Attempt-Id": "a0"}),
    ]


def anthropic_cases(model: str) -> list[HttpCase]:
    msgs = "/v1/messages"
    user = [{"role": "user", "content": "hi"}]

    def c(id_: str, klass: str, what: str, expect: HttpExpect, body: Any = None, *, raw: bytes | None = None,
          path: str = msgs, gap: str | None = None) -> HttpCase:
        return HttpCase(f"anthropic.{id_}", "anthropic", klass, what, path, expect, body, raw, "POST",
                        {"anthropic-version": "2023-06-01"}, gap)

    def req(**fields: Any) -> dict[str, Any]:
        return {"model": model, "max_tokens": 2, "messages": user, **fields}

    tool = {"name": "lookup", "input_schema": {"type": "object"}}
    return [
        c("json.not_json", "malformed JSON", "plain text body", _an(400), raw=b"not json"),
        c("json.truncated", "malformed JSON", "body cut mid-object", _an(400), raw=b'{"model": "m", "max'),
        c("json.empty", "malformed JSON", "empty body", _an(400), raw=b""),
        c("json.array", "malformed JSON", "top-level array", _an(400), [req()]),
        c("json.nan_literal", "malformed JSON", "NaN literal", _an(400),
          raw=b'{"model": "m", "max_tokens": 2, "messages": [], "temperature": NaN}'),
        c("utf8.invalid_bytes", "non-UTF-8", "a lone 0xff byte", _an(400), raw=b"\xff"),
        c("utf8.latin1", "non-UTF-8", "latin-1 encoded body", _an(400),
          raw='{"model": "\u00e9t\u00e9", "max_tokens": 2}'.encode("latin-1")),
        c("huge.content", "huge body", "one message over the body limit", _an(413, "request_too_large"),
          req(messages=[{"role": "user", "content": HUGE}])),
        c("missing.max_tokens", "missing field", "max_tokens is required", _an(400, contains="max_tokens"),
          {"model": model, "messages": user}),
        c("missing.messages", "missing messages", "no messages", _an(400, contains="messages"),
          {"model": model, "max_tokens": 2}),
        c("empty.messages", "missing messages", "messages = []", _an(400, contains="messages"), req(messages=[])),
        c("type.max_tokens", "wrong type", "max_tokens is a word", _an(400, contains="max_tokens"),
          req(max_tokens="ten")),
        c("type.content", "wrong type", "content is a number", _an(400, contains="content"),
          req(messages=[{"role": "user", "content": 42}])),
        c("type.system", "wrong type", "system is a number", _an(400, contains="system"), req(system=5)),
        c("type.stream", "wrong type", "stream is 'maybe'", _an(400, contains="stream"), req(stream="maybe")),
        c("type.stop_sequences", "wrong type", "stop_sequences is a string", _an(400, contains="stop_sequences"),
          req(stop_sequences="END")),
        c("model.unknown", "unknown model", "model claude-opus-9", _an(404, "not_found_error"),
          req(model="claude-opus-9")),
        c("max_tokens.over_limit", "max_tokens too large", "one over the gateway limit: served with the limit",
          _an(200), req(max_tokens=CORPUS_MAX_TOKENS + 1)),
        c("max_tokens.claude_code", "max_tokens too large", "max_tokens 64000, as Claude Code sends: served with "
          "what fits", _an(200), req(max_tokens=64000)),
        c("max_tokens.zero", "max_tokens too large", "max_tokens 0", _an(400, contains="max_tokens"),
          req(max_tokens=0)),
        c("role.system", "harness shape", "role 'system' inside messages, as Claude Code sends its per-turn "
          "context: rendered as a system turn where it stands", _an(200),
          req(messages=[*user, {"role": "system", "content": "x"}])),
        c("role.system_image", "bad role", "an image block in a 'system' message (text-only model)", _an(400),
          req(messages=[*user, {"role": "system", "content": [{"type": "image", "source": {}}]}])),
        c("role.tool", "bad role", "role 'tool' (an OpenAI role)", _an(400, contains="role"),
          req(messages=[{"role": "tool", "content": "x"}])),
        c("content.document", "bad role", "document block (text-only model)", _an(400),
          req(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}])),
        c("content.image", "bad role", "image block (text-only model)", _an(400),
          req(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])),
        c("content.tool_use_no_id", "bad tool schema", "tool_use block without id", _an(400, contains="id"),
          req(messages=[*user, {"role": "assistant", "content": [
              {"type": "tool_use", "name": "lookup", "input": {}}]}])),
        c("content.tool_result_no_id", "bad tool schema", "tool_result without tool_use_id",
          _an(400, contains="messages.0.content"),
          req(messages=[{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}])),
        c("tools.not_list", "bad tool schema", "tools is a string", _an(400, contains="tools"), req(tools="x")),
        c("tools.empty_name", "bad tool schema", "tool name ''", _an(400, contains="tools.0.name"),
          req(tools=[{"name": "", "input_schema": {}}])),
        c("tools.schema_string", "bad tool schema", "input_schema is a string",
          _an(400, contains="tools.0.input_schema"), req(tools=[{"name": "t", "input_schema": "object"}])),
        c("tools.server_tool", "bad tool schema", "server tool (web_search)", _an(400),
          req(tools=[{"type": "web_search_20250305", "name": "web_search"}])),
        c("tool_choice.unknown_type", "bad tool_choice", "tool_choice type 'whatever'",
          _an(400, contains="tool_choice"), req(tools=[tool], tool_choice={"type": "whatever"})),
        c("tool_choice.string", "bad tool_choice", "tool_choice 'auto' as a bare string",
          _an(400, contains="tool_choice"), req(tools=[tool], tool_choice="auto")),
        c("tool_choice.tool_without_name", "bad tool_choice", "type 'tool' without a name",
          _an(400, contains="tool_choice"), req(tools=[tool], tool_choice={"type": "tool"}),
          gap="accepted (200): tool_choice type 'tool' needs a name that is among the tools"),
        c("temperature.negative", "bad sampling", "temperature -1", _an(400, contains="temperature"),
          req(temperature=-1)),
        c("temperature.above_one", "bad sampling", "temperature 1.5 (Anthropic range 0..1)",
          _an(400, contains="temperature"), req(temperature=1.5)),
        c("temperature.nan", "bad sampling", "temperature 'NaN'", _an(400, contains="temperature"),
          req(temperature="NaN")),
        c("top_p.zero", "bad sampling", "top_p 0", _an(400, contains="top_p"), req(top_p=0)),
        c("top_k.negative", "bad sampling", "top_k -1", _an(400, contains="top_k"), req(top_k=-1)),
        c("count_tokens.document", "bad role", "count_tokens with a document block", _an(400),
          {"model": model, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
          path="/v1/messages/count_tokens"),
        c("count_tokens.no_messages", "missing messages", "count_tokens without messages",
          _an(400, contains="messages"), {"model": model}, path="/v1/messages/count_tokens"),
        c("route.unknown", "bad route", "unknown path under /v1/messages", _an(404, "not_found_error"), {},
          path="/v1/messages/nothing"),
        c("identity.finished_attempt", "events after finish", "a message on a finished attempt",
          _an(409), req(), path="/rollouts/{done}/v1/messages"),
    ]


def env_cases() -> list[HttpCase]:
    def c(id_: str, klass: str, what: str, path: str, expect: HttpExpect, body: Any = None, *,
          raw: bytes | None = None, method: str = "POST") -> HttpCase:
        return HttpCase(f"env.{id_}", "env", klass, what, path, expect, body, raw, method)

    live, done, base = "/v1/rollouts/{live}", "/v1/rollouts/{done}", "/v1/rollouts"
    return [
        c("events.unknown_rollout", "unknown rollout id", "events for a rollout nobody started",
          f"{base}/never-started/attempts/a0/events", _env(404, "unknown_rollout"), {"kind": "STEP"}),
        c("finish.before_start", "finish before start", "finish of a rollout nobody started",
          f"{base}/never-started/attempts/a0/finish", _env(404, "unknown_rollout"), {}),
        c("status.unknown_rollout", "unknown rollout id", "status of a rollout nobody started",
          f"{base}/never-started/attempts/a0", _env(404, "unknown_rollout"), method="GET"),
        c("retry.unknown_rollout", "unknown rollout id", "a retry attempt of a rollout nobody started",
          f"{base}/never-started/attempts", _env(404, "unknown_rollout"), {}),
        c("events.unknown_attempt", "unknown rollout id", "events for an attempt id the rollout never had",
          "/v1/rollouts/{live_rollout}/attempts/not-an-attempt/events", _env(404), {"kind": "STEP"}),
        c("start.group_size_zero", "wrong type", "expected_group_size 0", base, _env(400, error_type="invalid_request"),
          {"expected_group_size": 0}),
        c("start.unknown_field", "wrong type", "an unknown field", base, _env(400, error_type="invalid_request"),
          {"surprise": 1}),
        c("start.bad_rollout_id", "wrong type", "rollout_id with spaces and slashes", base,
          _env(400, error_type="invalid_request"), {"rollout_id": "a b/c"}),
        c("start.empty_rollout_id", "wrong type", "rollout_id ''", base, _env(400, error_type="invalid_request"),
          {"rollout_id": ""}),
        c("start.group_key_nested", "wrong type", "group_key values must be strings", base,
          _env(400, error_type="invalid_request"), {"group_key": {"task": {"nested": 1}}}),
        c("start.not_json", "malformed JSON", "plain text body", base, _env(400, "invalid_json"), raw=b"start please"),
        c("start.array", "malformed JSON", "top-level array", base, _env(400, "invalid_json"), [1]),
        c("start.non_utf8", "non-UTF-8", "a 0xff byte", base, _env(400, "invalid_encoding"), raw=b'{"x": "\xff"}'),
        c("start.huge", "oversized payload", "task_input over the body limit", base,
          _env(413, "request_too_large"), {"task_input": HUGE}),
        c("start.in_progress", "duplicate start", "restart a rollout whose attempt is still open", base,
          _env(409, "attempt_in_progress"), {"rollout_id": "{live_rollout}"}),
        c("retry.in_progress", "duplicate start", "a retry while the attempt is still open",
          "/v1/rollouts/{live_rollout}/attempts", _env(409, "attempt_in_progress"), {}),
        c("events.bad_kind", "bad event kind", "kind 'BOGUS'", f"{live}/events",
          _env(400, error_type="invalid_request"), {"kind": "BOGUS"}),
        c("events.no_kind", "bad event kind", "event without kind", f"{live}/events",
          _env(400, error_type="invalid_request"), {"payload": 1}),
        c("events.kind_number", "bad event kind", "kind 5", f"{live}/events", _env(400, error_type="invalid_request"),
          {"kind": 5}),
        c("events.empty_batch", "bad event kind", "events = []", f"{live}/events",
          _env(400, error_type="invalid_request"), {"events": []}),
        c("events.too_many", "oversized payload", "1001 events in one request", f"{live}/events",
          _env(400, error_type="invalid_request"), {"events": [{"kind": "STEP"}] * 1001}),
        c("events.future_call", "bad event kind", "call_index of a call that does not exist yet",
          f"{live}/events", _env(400, contains="does not exist yet"), {"kind": "TOOL_RESULT", "call_index": 10**6}),
        c("events.both_refs", "bad event kind", "call_id and call_index together", f"{live}/events",
          _env(400, contains="not both"), {"kind": "STEP", "call_id": "c", "call_index": 0}),
        c("events.negative_index", "bad event kind", "call_index -1", f"{live}/events",
          _env(400, error_type="invalid_request"), {"kind": "STEP", "call_index": -1}),
        c("events.unknown_field", "bad event kind", "an unknown field on an event", f"{live}/events",
          _env(400, error_type="invalid_request"), {"kind": "STEP", "colour": "red"}),
        c("events.oversized_payload", "oversized payload", "payload over the body limit", f"{live}/events",
          _env(413, "request_too_large"), {"kind": "OBSERVATION", "payload": HUGE}),
        c("events.non_utf8", "non-UTF-8", "latin-1 encoded event", f"{live}/events", _env(400, "invalid_encoding"),
          raw='{"kind": "STEP", "payload": "d\u00e9j\u00e0"}'.encode("latin-1")),
        c("events.after_finish", "events after finish", "an event on a finished attempt", f"{done}/events",
          _env(409, "attempt_finished"), {"kind": "STEP"}),
        c("finish.duplicate", "duplicate finish", "finishing an attempt twice", f"{done}/finish",
          _env(409, "attempt_finished"), {}),
        c("finish.bad_status", "wrong type", "status 'MAYBE'", f"{live}/finish",
          _env(400, error_type="invalid_request"), {"status": "MAYBE"}),
        c("finish.unknown_field", "wrong type", "an unknown field on finish", f"{live}/finish",
          _env(400, error_type="invalid_request"), {"status": "SUCCESS", "score": 1}),
        c("finish.not_json", "malformed JSON", "plain text finish body", f"{live}/finish",
          _env(400, "invalid_json"), raw=b"done!"),
        c("finish.huge_artifacts", "oversized payload", "final artifacts over the body limit", f"{live}/finish",
          _env(413, "request_too_large"), {"final_artifacts": {"log": HUGE}}),
    ]


def responses_cases(model: str) -> list[HttpCase]:
    """OpenAI Responses as Codex CLI sends it (tests/harnesses/captured/codex*.jsonl), cut to fit the corpus's
    small model: its tool shapes and Responses options now served (200), and what the gateway cannot serve
    refused in OpenAI's error shape, naming the field."""
    path = "/v1/responses"

    def c(id_: str, klass: str, what: str, expect: HttpExpect, body: Any) -> HttpCase:
        return HttpCase(f"openai.responses.{id_}", "openai", klass, what, path, expect, body)

    def text(role: str, words: str) -> dict[str, Any]:
        return {"type": "message", "role": role, "content": [{"type": "input_text", "text": words}]}

    turn = [text("developer", "Be brief."), text("user", "hi")]

    def req(**fields: Any) -> dict[str, Any]:
        # Codex's options on every request: no max_output_tokens (the corpus caps it to keep calls short).
        return {"model": model, "input": turn, "max_output_tokens": 2, "stream": False, "store": False,
                "include": ["reasoning.encrypted_content"], "prompt_cache_key": "corpus-session",
                "reasoning": {"summary": "auto"}, "tool_choice": "auto", "parallel_tool_calls": True, **fields}

    fn = {"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
    spawn = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}, "strict": False}
    exec_js = {"type": "custom", "name": "exec", "description": "Run JavaScript.",
               "format": {"type": "grammar", "syntax": "lark", "definition": "start: /(.|\\n)+/"}}
    namespace = {"type": "namespace", "name": "multi_agent_v1", "description": "Agents.", "tools": [spawn]}
    replayed = [*turn, {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Plan."}],
                        "content": None, "encrypted_content": "opaque"},
                {"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "call_1",
                 "name": "exec", "input": "text(1)"},
                {"type": "custom_tool_call_output", "call_id": "call_1",
                 "output": [{"type": "input_text", "text": "Script completed\n"}, {"type": "input_text", "text": "1"}]},
                {"type": "function_call", "id": "fc_2", "status": "completed", "call_id": "call_2",
                 "name": "spawn_agent", "namespace": "multi_agent_v1", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_2", "output": "spawned"}]
    return [
        c("codex.namespace", "harness shape", "a namespace tool (Codex's multi_agent_v1): its functions rendered "
          "as multi_agent_v1.<name>, calls mapped back", _oa(200), req(tools=[fn, namespace])),
        c("codex.web_search", "harness shape", "Codex's hosted web_search tool: left out of the prompt and listed "
          "in the record (ignored_by_upstream.omitted_hosted_tools)", _oa(200),
          req(tools=[fn, {"type": "web_search", "external_web_access": False}])),
        c("codex.custom_grammar", "harness shape", "tools in an additional_tools input item, a custom tool with a "
          "lark grammar (shown, not enforced: recorded), text.verbosity, parallel_tool_calls false", _oa(200),
          req(input=[{"type": "additional_tools", "id": "at_1", "role": "developer", "tools": [
              {"type": "namespace", "name": "functions", "description": "", "tools": [exec_js]}]}, *turn],
              text={"verbosity": "low"}, parallel_tool_calls=False)),
        c("codex.replayed_turn", "harness shape", "a turn sent back as Codex does: reasoning with encrypted_content "
          "and content null, a custom_tool_call, its output as input_text parts, a namespaced function_call",
          _oa(200), req(input=replayed, tools=[{"type": "namespace", "name": "functions", "tools": [exec_js]},
                                                namespace])),
        c("max_output_tokens.huge", "max_tokens too large", "max_output_tokens 128000: served with what fits",
          _oa(200), req(max_output_tokens=128_000)),
        c("tools.local_shell", "bad tool schema", "local_shell (a tool the client runs in the model's own "
          "format): refused", _oa(400, param="tools.1.type", contains="'local_shell' is not supported"),
          req(tools=[fn, {"type": "local_shell"}])),
        c("tools.file_search", "bad tool schema", "hosted file_search (the gateway cannot run it)",
          _oa(400, param="tools.0.type", contains="cannot run hosted tools"),
          req(tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}])),
        c("tools.unknown_type", "bad tool schema", "tool type 'retrieval'", _oa(400, param="tools.0.type"),
          req(tools=[{"type": "retrieval"}])),
        c("tools.hosted_in_namespace", "bad tool schema", "a hosted tool inside a namespace",
          _oa(400, param="tools.0.tools.1.type"),
          req(tools=[{"type": "namespace", "name": "x", "tools": [spawn, {"type": "code_interpreter"}]}])),
        c("tools.namespaced_twice", "bad tool schema", "two tools rendering to one name",
          _oa(400, param="tools.1.tools.0.name", contains="declared twice"), req(tools=[namespace, namespace])),
        c("tools.custom_no_name", "bad tool schema", "custom tool without a name",
          _oa(400, contains="tools.0.custom.name"), req(tools=[{"type": "custom"}])),
        c("input.custom_call_no_input", "bad tool schema", "custom_tool_call item without input",
          _oa(400, contains="custom_tool_call.input"),
          req(input=[*turn, {"type": "custom_tool_call", "call_id": "call_1", "name": "exec"}])),
        c("input.image", "bad role", "input_image part (text-only model)",
          _oa(400, param="input.1.content.0.type", contains="'input_image' is not supported"),
          req(input=[turn[0], {"type": "message", "role": "user", "content": [
              {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}])),
        c("input.item_reference", "bad role", "item_reference (needs stored responses)",
          _oa(400, param="input.2.type"), req(input=[*turn, {"type": "item_reference", "id": "msg_1"}])),
        c("previous_response_id", "unsupported parameter", "previous_response_id (the gateway stores no "
          "responses)", _oa(400, "unsupported_parameter", "previous_response_id"),
          req(previous_response_id="resp_1")),
        c("text.json_schema", "unsupported parameter", "text.format json_schema (output cannot be constrained)",
          _oa(400, param="text.format.type"),
          req(text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}})),
    ]


def http_cases(model: str) -> list[HttpCase]:
    from tokentrail.reliability.openclaw_shapes import openclaw_cases  # it builds on this module's cases

    return [*openai_cases(model), *responses_cases(model), *anthropic_cases(model), *openclaw_cases(model),
            *env_cases()]


# ------------------------------------------------------------------------------------------ security

# The security cases run on a second gateway that requires keys: ``require_auth`` and this admin key.
SECURITY_ADMIN_KEY = "corpus-admin-key-5f0c9d"
# Credentials sent along with accepted calls: they must reach Kafka only as "[redacted]".
HEADER_SECRET = "sk-header-secret-8c1e47"
BODY_SECRET = "sk-body-secret-2b96d3"


@dataclass(frozen=True)
class SecurityCase:
    """A request to a gateway that requires keys, judged like an HttpCase (``request.expect``), plus what
    must hold after it:

    ``untouched``: the other rollout's open attempt ({victim}) got no call, event, finish or retry;
    ``redacted``: the request is accepted (``request.expect.status`` is 200) and the stored request of its
    CallRecord, read back from Kafka, has "[redacted]" at these places (``headers.<name>`` or
    ``body.<field>``); no key or secret may appear anywhere in any record's bytes.
    ``chunked``: the body is streamed without a Content-Length (the limit must hold for what is read).
    ``gap`` / ``gap_status``: the gateway's answer today where it is not the right one; the case then
    passes only with exactly ``gap_status`` (never a success) and the checks above, and is reported as a gap.

    Placeholders: ``{live}`` / ``{victim}`` are ``<rollout>/attempts/<attempt>`` of two open attempts of
    different rollouts, ``{live_rollout}`` / ``{victim_rollout}`` their rollout ids, ``{live_key}`` the
    live attempt's own key (minted by ``POST /v1/rollouts``), ``{admin_key}`` the gateway's admin key.
    """

    id: str
    klass: str
    what: str
    request: HttpCase
    untouched: bool = False
    redacted: tuple[str, ...] = ()
    chunked: bool = False
    gap: str | None = None
    gap_status: int | None = None


def security_cases(model: str) -> list[SecurityCase]:
    chat, msgs = "/v1/chat/completions", "/v1/messages"
    user = [{"role": "user", "content": "hi"}]
    openai_req = {"model": model, "messages": user, "max_tokens": 2}
    anthropic_req = {"model": model, "messages": user, "max_tokens": 2}
    anthropic_version = {"anthropic-version": "2023-06-01"}
    bearer = {"authorization": "Bearer {live_key}"}
    permission_gap = "401 (authentication_error): a valid key used where it has no rights is not told apart " \
                     "from a wrong key"

    def c(id_: str, klass: str, what: str, area: Literal["openai", "anthropic", "env"], path: str,
          expect: HttpExpect, body: Any = None, *, method: str = "POST", headers: dict[str, str] | None = None,
          untouched: bool = False, redacted: tuple[str, ...] = (), chunked: bool = False,
          gap_status: int | None = None) -> SecurityCase:
        request = HttpCase(f"security.{id_}", area, klass, what, path, expect, body, None, method,
                           dict(headers or {}))
        return SecurityCase(request.id, klass, what, request, untouched, redacted, chunked,
                            permission_gap if gap_status else None, gap_status)

    # Management with a key that is not the admin key: 401 or 403 are both right; this gateway says 401.
    no_key, isolation, admin = "request without a valid key", "another rollout's key", "management without admin key"
    redaction, size = "credentials in a recorded call", "body over the size limit"
    unauth_oa = _oa(401, "invalid_api_key", error_type="authentication_error")
    return [
        c("no_key.openai_path", no_key, "chat call on an attempt path without any key", "openai",
          f"/rollouts/{{live}}{chat}", unauth_oa, openai_req),
        c("no_key.anthropic_path", no_key, "messages call on an attempt path without any key", "anthropic",
          f"/rollouts/{{live}}{msgs}", _an(401, "authentication_error"), anthropic_req, headers=anthropic_version),
        c("no_key.unattributed", no_key, "chat call with neither key nor rollout", "openai", chat, unauth_oa,
          openai_req),
        c("no_key.header_identity", no_key, "X-Rollout-Id of an open attempt but no key", "openai", chat, unauth_oa,
          openai_req, headers={"X-Rollout-Id": "{live_rollout}"}),
        c("no_key.wrong_bearer", no_key, "a key nobody issued, on an attempt path", "openai",
          f"/rollouts/{{live}}{chat}", unauth_oa, openai_req, headers={"authorization": "Bearer sk-not-a-key"}),
        c("no_key.forged_rollout_key", no_key, "a made-up key with the rollout-key prefix (x-api-key)", "anthropic",
          msgs, _an(401, "authentication_error"), anthropic_req,
          headers={**anthropic_version, "x-api-key": "tt-forged-0000000000000000"}),
        c("no_key.events", no_key, "environment events without any key", "env", "/v1/rollouts/{live}/events",
          _env(401, "invalid_api_key", "authentication"), {"kind": "STEP"}),
        c("no_key.status", no_key, "attempt status without any key", "env", "/v1/rollouts/{live}",
          _env(401, "invalid_api_key", "authentication"), method="GET"),
        c("isolation.openai_path", isolation, "chat call on another rollout's attempt path", "openai",
          f"/rollouts/{{victim}}{chat}", _oa(403, error_type="permission_error"), openai_req, headers=bearer,
          untouched=True, gap_status=401),
        c("isolation.anthropic_path", isolation, "messages call on another rollout's attempt path", "anthropic",
          f"/rollouts/{{victim}}{msgs}", _an(403, "permission_error"), anthropic_req,
          headers={**anthropic_version, "x-api-key": "{live_key}"}, untouched=True, gap_status=401),
        c("isolation.header", isolation, "chat call naming another rollout in X-Rollout-Id", "openai", chat,
          _oa(403, error_type="permission_error"), openai_req, headers={**bearer, "X-Rollout-Id": "{victim_rollout}"},
          untouched=True, gap_status=401),
        c("isolation.events", isolation, "events posted to another rollout's attempt", "env",
          "/v1/rollouts/{victim}/events", _env(403, error_type="permission"), {"kind": "STEP"}, headers=bearer,
          untouched=True, gap_status=401),
        c("isolation.finish", isolation, "finishing another rollout's attempt", "env", "/v1/rollouts/{victim}/finish",
          _env(403, error_type="permission"), {"status": "SUCCESS"}, headers=bearer, untouched=True, gap_status=401),
        c("isolation.status", isolation, "reading another rollout's attempt status", "env", "/v1/rollouts/{victim}",
          _env(403, error_type="permission"), method="GET", headers=bearer, untouched=True, gap_status=401),
        c("admin.start_no_key", admin, "start a rollout without any key", "env", "/v1/rollouts",
          _env(401, "invalid_api_key", "authentication"), {"task_input": {"answer": "4"}}),
        c("admin.start_wrong_key", admin, "start a rollout with a wrong admin key", "env", "/v1/rollouts",
          _env(401, "invalid_api_key", "authentication"), {"task_input": {"answer": "4"}},
          headers={"authorization": "Bearer not-the-admin-key"}),
        c("admin.start_rollout_key", admin, "start a rollout with a rollout's own key", "env", "/v1/rollouts",
          _env(401, "invalid_api_key", "authentication"), {"task_input": {"answer": "4"}}, headers=bearer),
        c("admin.retry_no_key", admin, "a retry attempt of another rollout without any key", "env",
          "/v1/rollouts/{victim_rollout}/attempts", _env(401, "invalid_api_key", "authentication"), {},
          untouched=True),
        c("admin.retry_rollout_key", admin, "a retry attempt of another rollout with a rollout key", "env",
          "/v1/rollouts/{victim_rollout}/attempts", _env(401, "invalid_api_key", "authentication"), {},
          headers=bearer, untouched=True),
        c("redact.openai", redaction, "Authorization, x-api-key and a body api_key on an accepted chat call",
          "openai", f"/rollouts/{{live}}{chat}", HttpExpect(200, "openai"),
          {**openai_req, "api_key": BODY_SECRET, "user": "corpus"},
          headers={**bearer, "x-api-key": HEADER_SECRET},
          redacted=("headers.authorization", "headers.x-api-key", "body.api_key")),
        c("redact.anthropic", redaction, "x-api-key (the rollout key) and a body api_key on accepted messages",
          "anthropic", msgs, HttpExpect(200, "anthropic"), {**anthropic_req, "api_key": BODY_SECRET},
          headers={**anthropic_version, "x-api-key": "{live_key}"},
          redacted=("headers.x-api-key", "body.api_key")),
        c("size.chunked_no_length", size, "a streamed body over the limit without Content-Length", "openai",
          f"/rollouts/{{live}}{chat}", _oa(413, "request_too_large"),
          {**openai_req, "messages": [{"role": "user", "content": HUGE}]}, headers=bearer, chunked=True),
    ]


# ------------------------------------------------------------------------------------------ topics


@dataclass(frozen=True)
class TopicMessage:
    topic: Literal["calls", "env", "rollouts"]
    key: bytes
    value: bytes


@dataclass(frozen=True)
class TopicCase:
    """``build(codec)`` gives the messages in order; ``bad_index`` picks the bad one.

    ``dead_letter``: (stage, error_type, reason substring) the worker must write for the bad message.
    ``expect_incomplete``: instead of a dead letter, the attempt's rollout is INCOMPLETE and its
    ``missing`` names this substring (prompt deltas that cannot be rebuilt are a rollout-level fault).
    ``sink``: error_type the ClickHouse sink must dead-letter the bad message with (None: it is a
    well-formed record the sink stores as a row).
    """

    id: str
    klass: str
    what: str
    build: Callable[[Codec], list[TopicMessage]]
    dead_letter: tuple[str, str, str] | None = None
    expect_incomplete: str | None = None
    sink: str | None = None
    bad_index: int = -1  # which of the built messages is the bad one

    def bad(self, messages: list[TopicMessage]) -> TopicMessage:
        return messages[self.bad_index]


T0_US = 1_800_000_000_000_000


def _rollout(tag: str) -> str:
    return f"bad-{tag}"


def _turns(n: int, seed: int) -> list[Any]:
    from processors.testing import growing_turns

    return growing_turns(np.random.default_rng(seed), n, 24, 6, 8, vocab=900)


def _call(rid: str, index: int, seed: int = 0, **changes: Any) -> Record:
    from schemas.builders import make_call

    turns = _turns(index + 1, seed)
    record = make_call(rid, "a1", index, turns[index].prompt, turns[index].output,
                       received_at_us=T0_US + 1000 * (index + 1))
    record.update(changes)
    return record


def _started(rid: str, **changes: Any) -> Record:
    from schemas.builders import make_started

    return {**make_started(rid, "a1", task_input={"answer": "4"}, created_at_us=T0_US), **changes}


def _calls(m: Record, codec: Codec, name: str = "CallRecord", key: str | None = None) -> TopicMessage:
    return TopicMessage("calls", (key or m["rollout_id"]).encode(), codec.encode(name, m))


def _env_msg(name: str, m: Record, codec: Codec, key: str | None = None) -> TopicMessage:
    return TopicMessage("env", (key or m["rollout_id"]).encode(), codec.encode(name, m))


def _delta_attempt(codec: Codec, rid: str, spoil: Callable[[Record], None]) -> list[TopicMessage]:
    """A complete two-call attempt whose second prompt is a delta on the first, spoiled by ``spoil``."""
    from processors.testing import AttemptSpec, attempt_events

    events = attempt_events(AttemptSpec(rid, "a1", _turns(2, 7), env_events=0, task_input={"answer": "4"},
                                        t0_us=T0_US))
    out = []
    for name, rec in events:
        if name == "CallRecord" and rec["call_index"] == 1:
            assert rec["prompt"]["base_call_id"], "the second call must be delta-encoded"
            rec = {**rec, "prompt": dict(rec["prompt"])}
            spoil(rec)
        out.append(_calls(rec, codec) if name == "CallRecord" else _env_msg(name, rec, codec))
    return out


def _missing_base(rec: Record) -> None:
    rec["prompt"]["base_call_id"] = "a-call-that-never-was"


def _wrong_hash(rec: Record) -> None:
    rec["prompt"]["sha256"] = "0" * 64


def _long_prefix(rec: Record) -> None:
    rec["prompt"]["base_prefix_len"] = 10_000


def _unknown_fp(body: bytes) -> bytes:
    return b"\xc3\x01" + b"\x13\x37" * 4 + body


def _score(rid: str) -> Record:
    return {"event_id": f"s-{rid}", "rollout_id": rid, "rollout_event_id": "e", "group_id": "g",
            "verifier_name": "v", "verifier_version": "1", "scope": "ROLLOUT", "status": "OK", "raw_json": "1",
            "error": None, "duration_ms": 0.0, "created_at_us": T0_US}


def topic_cases() -> list[TopicCase]:
    """Bad records for the stream processors (and the sink). Rollout ids are unique per case."""
    from schemas.builders import make_env, make_finished

    def r(tag: str) -> str:
        return _rollout(tag)

    def single(topic: Literal["calls", "env", "rollouts"], tag: str,
               value: Callable[[Codec], bytes]) -> Callable[[Codec], list[TopicMessage]]:
        return lambda codec: [TopicMessage(topic, r(tag).encode(), value(codec))]

    asm = "assembler"
    return [
        TopicCase("topic.calls.not_avro", "corrupt record", "plain text on the calls topic",
                  single("calls", "t1", lambda _c: b"this is not avro"), (asm, "CorruptRecord", "unknown framing"),
                  sink="CorruptRecord"),
        TopicCase("topic.env.not_avro", "corrupt record", "random bytes on the env topic",
                  single("env", "t2", lambda _c: bytes(range(7, 90))), (asm, "CorruptRecord", "unknown framing"),
                  sink="CorruptRecord"),
        TopicCase("topic.calls.trailing_bytes", "corrupt record", "a valid call followed by two extra bytes",
                  single("calls", "t3", lambda c: c.encode("CallRecord", _call(r("t3"), 0)) + b"!!"),
                  (asm, "CorruptRecord", "trailing bytes"), sink="CorruptRecord"),
        TopicCase("topic.calls.unknown_fingerprint", "unknown fingerprint", "a schema fingerprint nobody knows",
                  single("calls", "t4", lambda c: _unknown_fp(c.encode("CallRecord", _call(r("t4"), 0))[10:])),
                  (asm, "UnknownFingerprint", "fingerprint"), sink="UnknownFingerprint"),
        TopicCase("topic.env.unknown_fingerprint", "unknown fingerprint", "unknown fingerprint on the env topic",
                  single("env", "t5", lambda _c: _unknown_fp(b"\x00" * 12)), (asm, "UnknownFingerprint", "fingerprint"),
                  sink="UnknownFingerprint"),
        TopicCase("topic.calls.truncated_body", "truncated payload", "a call record cut after 40 bytes",
                  single("calls", "t6", lambda c: c.encode("CallRecord", _call(r("t6"), 0))[:40]),
                  (asm, "TruncatedPayload", "ends early"), sink="TruncatedPayload"),
        TopicCase("topic.calls.truncated_header", "truncated payload", "only 5 bytes of the 10-byte header",
                  single("calls", "t7", lambda _c: b"\xc3\x01abc"), (asm, "TruncatedPayload", "header"),
                  sink="TruncatedPayload"),
        TopicCase("topic.env.truncated_body", "truncated payload", "an AttemptStarted cut after 12 bytes",
                  single("env", "t8", lambda c: c.encode("AttemptStarted", _started(r("t8")))[:12]),
                  (asm, "TruncatedPayload", "ends early"), sink="TruncatedPayload"),
        TopicCase("topic.calls.score_record", "schema-incompatible record", "a Score on the calls topic",
                  single("calls", "t9", lambda c: c.encode("Score", _score(r("t9")))),
                  (asm, "SchemaMismatch", "expected CallRecord, got Score"), sink="SchemaMismatch"),
        TopicCase("topic.env.call_record", "schema-incompatible record", "a CallRecord on the env topic",
                  single("env", "t10", lambda c: c.encode("CallRecord", _call(r("t10"), 0))),
                  (asm, "SchemaMismatch", "got CallRecord"), sink="SchemaMismatch"),
        TopicCase("topic.calls.wrong_key", "schema-incompatible record", "a call keyed by another rollout",
                  lambda c: [_calls(_call(r("t11"), 0), c, key="someone-else")],
                  (asm, "InvalidEvent", "not its rollout id")),
        TopicCase("topic.calls.no_rollout_id", "schema-incompatible record", "a call with an empty rollout id",
                  lambda c: [TopicMessage("calls", r("t12").encode(),
                                          c.encode("CallRecord", _call(r("t12"), 0, rollout_id="")))],
                  (asm, "InvalidEvent", "has no rollout_id")),
        TopicCase("topic.calls.odd_output_bytes", "schema-incompatible record", "output_ids of 7 bytes",
                  lambda c: [_calls(_call(r("t13"), 0, output_ids=b"\x01" * 7), c)],
                  (asm, "InvalidEvent", "not a multiple of 4")),
        TopicCase("topic.calls.logprob_count", "schema-incompatible record", "fewer logprobs than output tokens",
                  lambda c: [_calls(_call(r("t14"), 0, output_logprobs=b"\x00" * 4), c)],
                  (asm, "InvalidEvent", "logprobs")),
        TopicCase("topic.calls.negative_index", "schema-incompatible record", "call_index -1",
                  lambda c: [_calls(_call(r("t15"), 0, call_index=-1), c)], (asm, "InvalidEvent", "negative")),
        TopicCase("topic.calls.conflicting", "duplicate slot", "a second, different call claiming call slot 0",
                  lambda c: [_env_msg("AttemptStarted", _started(r("t16")), c), _calls(_call(r("t16"), 0), c),
                             _calls(_call(r("t16"), 0, event_id="other-event-id"), c)],
                  (asm, "ConflictingEvent", "already held")),
        TopicCase("topic.env.finish_negative", "schema-incompatible record", "AttemptFinished with call_count -1",
                  lambda c: [_env_msg("AttemptFinished", make_finished(r("t17"), "a1", -1, 0), c)],
                  (asm, "InvalidEvent", "negative counts")),
        TopicCase("topic.env.step_negative", "schema-incompatible record", "EnvStep with event_index -1",
                  lambda c: [_env_msg("EnvStep", {**make_env(r("t18"), "a1", 0), "event_index": -1}, c)],
                  (asm, "InvalidEvent", "negative event_index")),
        TopicCase("topic.env.attempt_number_zero", "schema-incompatible record", "AttemptStarted attempt_number 0",
                  lambda c: [_env_msg("AttemptStarted", _started(r("t19"), attempt_number=0), c)],
                  (asm, "InvalidEvent", "attempt_number")),
        TopicCase("topic.rollouts.unknown_fingerprint", "unknown fingerprint", "junk on the rollouts topic",
                  single("rollouts", "t20", lambda _c: _unknown_fp(b"junk")), ("router", "UnknownFingerprint",
                                                                                "fingerprint"),
                  sink="UnknownFingerprint"),
        TopicCase("topic.rollouts.call_record", "schema-incompatible record", "a CallRecord on the rollouts topic",
                  single("rollouts", "t21", lambda c: c.encode("CallRecord", _call(r("t21"), 0))),
                  ("router", "SchemaMismatch", "expected CompletedRollout"), sink="SchemaMismatch"),
        TopicCase("topic.delta.missing_base", "delta with missing base", "a prompt delta on a call that never was",
                  lambda c: _delta_attempt(c, r("t22"), _missing_base), expect_incomplete="DeltaBaseMissing"),
        TopicCase("topic.delta.wrong_hash", "delta with wrong hash", "a prompt delta whose sha256 is wrong",
                  lambda c: _delta_attempt(c, r("t23"), _wrong_hash), expect_incomplete="DeltaHashMismatch"),
        TopicCase("topic.delta.prefix_too_long", "delta with wrong hash", "a delta whose sizes do not add up",
                  lambda c: _delta_attempt(c, r("t24"), _long_prefix), (asm, "InvalidEvent", "do not add up"),
                  bad_index=2),
    ]


# ------------------------------------------------------------------------------------------ configs


@dataclass(frozen=True)
class ConfigCase:
    """``kind`` names the loader: reward | credit | sample | grouping (processors.config.load_config on
    YAML text or a path) or verifier (processors.verifiers.load_verifiers on a list of specs)."""

    id: str
    klass: str
    what: str
    kind: Literal["reward", "credit", "sample", "grouping", "verifier", "reward_file"]
    source: Any
    contains: str  # substring of the ConfigError message


@dataclass(frozen=True)
class VerifierCase:
    """A misbehaving verifier run on a real rollout: the Score's status and an error substring."""

    id: str
    klass: str
    what: str
    spec: str | dict[str, Any]
    status: Literal["ERROR", "TIMEOUT"]
    contains: str


GOOD_REWARD = "metrics: [{name: correct, verifier: answer_match, path: score}]\n"


def config_cases() -> list[ConfigCase]:
    def c(id_: str, klass: str, what: str, kind: Any, source: Any, contains: str) -> ConfigCase:
        return ConfigCase(f"config.{id_}", klass, what, kind, source, contains)

    rw = "invalid reward YAML"
    return [
        c("reward.not_yaml", rw, "unbalanced brackets", "reward", "metrics: [\n  {name: x\n", "not valid YAML"),
        c("reward.top_level_list", rw, "a list at the top level", "reward", "- 1\n- 2\n", "expected a mapping"),
        c("reward.no_metrics", rw, "no metrics", "reward", "name: x\ncombine: min\n", "metrics"),
        c("reward.empty_metrics", rw, "metrics: []", "reward", "metrics: []\n", "metrics"),
        c("reward.unknown_field", rw, "a misspelt key", "reward", GOOD_REWARD + "normalise: {method: grpo}\n",
          "normalise"),
        c("reward.combine", rw, "combine: avg", "reward", GOOD_REWARD + "combine: avg\n", "combine"),
        c("reward.normalize_method", rw, "normalize.method: zscore", "reward",
          GOOD_REWARD + "normalize: {method: zscore}\n", "normalize.method"),
        c("reward.clip_reversed", rw, "clip [5, -5]", "reward", GOOD_REWARD + "clip: [5, -5]\n", "clip"),
        c("reward.duplicate_metric", rw, "two metrics with one name", "reward",
          "metrics: [{name: a, verifier: v}, {name: a, verifier: w}]\n", "unique"),
        c("reward.std_ddof", rw, "std_ddof 2", "reward", GOOD_REWARD + "normalize: {std_ddof: 2}\n", "std_ddof"),
        c("reward.on_error", rw, "on_error: explode", "reward",
          "metrics: [{name: a, verifier: v, on_error: explode}]\n", "on_error"),
        c("reward.weight_word", rw, "weight: heavy", "reward", "metrics: [{name: a, verifier: v, weight: heavy}]\n",
          "weight"),
        c("reward.version_2", rw, "format version 2", "reward", GOOD_REWARD + "version: 2\n", "version"),
        c("reward.negative_eps", rw, "zero_variance_eps -1", "reward",
          GOOD_REWARD + "filters: {zero_variance_eps: -1}\n", "zero_variance_eps"),
        c("reward.missing_file", rw, "a path that does not exist", "reward_file",
          "/nonexistent/tokentrail/reward.yaml", "cannot read"),
        c("credit.level", "invalid credit YAML", "level: episode", "credit", "level: episode\n", "level"),
        c("credit.discount_zero", "invalid credit YAML", "call_discount 0", "credit", "call_discount: 0\n",
          "call_discount"),
        c("credit.discount_above_one", "invalid credit YAML", "token_discount 1.5", "credit",
          "token_discount: 1.5\n", "token_discount"),
        c("credit.weighting", "invalid credit YAML", "weighting: whatever", "credit", "weighting: whatever\n",
          "weighting"),
        c("credit.negative_weight", "invalid credit YAML", "rollout_weight -1", "credit", "rollout_weight: -1\n",
          "rollout_weight"),
        c("credit.unknown_field", "invalid credit YAML", "a misspelt key", "credit", "levle: rollout\n", "levle"),
        c("sample.pack_zero", "invalid sample YAML", "pack.max_tokens 0", "sample", "pack: {max_tokens: 0}\n",
          "pack.max_tokens"),
        c("sample.negative_max", "invalid sample YAML", "max_sample_tokens -1", "sample",
          "max_sample_tokens: -1\n", "max_sample_tokens"),
        c("sample.merge_word", "invalid sample YAML", "merge: perhaps", "sample", "merge: perhaps\n", "merge"),
        c("sample.unknown_field", "invalid sample YAML", "a misspelt key", "sample", "packing: true\n", "packing"),
        c("sample.not_mapping", "invalid sample YAML", "a bare number", "sample", "42\n", "expected a mapping"),
        c("grouping.fallback", "invalid grouping YAML", "fallback: group", "grouping", "fallback: group\n",
          "fallback"),
        c("grouping.window_zero", "invalid grouping YAML", "window_s 0", "grouping", "window_s: 0\n", "window_s"),
        c("verifier.no_colon", "unknown verifier import path", "'module.Class' instead of 'module:Class'",
          "verifier", ["processors.verifiers.answer_match.AnswerMatch"], "not 'module:Class'"),
        c("verifier.no_module", "unknown verifier import path", "a module that does not exist", "verifier",
          ["processors.no_such_module:Thing"], "cannot import"),
        c("verifier.no_class", "unknown verifier import path", "a class the module lacks", "verifier",
          ["processors.testing:NoSuchVerifier"], "not a Verifier subclass"),
        c("verifier.not_verifier", "unknown verifier import path", "a class that is not a Verifier", "verifier",
          ["processors.testing:Turn"], "not a Verifier subclass"),
        c("verifier.spec_unknown_key", "unknown verifier import path", "a spec with an unknown key", "verifier",
          [{"ref": "processors.verifiers.answer_match:AnswerMatch", "retries": 3}], "needs 'ref'"),
        c("verifier.bad_option", "unknown verifier import path", "an option the verifier does not have",
          "verifier", [{"ref": "processors.verifiers.answer_match:AnswerMatch", "options": {"strictness": 9}}],
          "bad options"),
        c("verifier.timeout_zero", "unknown verifier import path", "timeout_s 0", "verifier",
          [{"ref": "processors.verifiers.answer_match:AnswerMatch", "timeout_s": 0}], "timeout_s"),
        c("verifier.isolation", "unknown verifier import path", "isolation: container", "verifier",
          [{"ref": "processors.verifiers.answer_match:AnswerMatch", "isolation": "container"}], "isolation"),
        c("verifier.duplicate", "unknown verifier import path", "the same verifier twice", "verifier",
          ["processors.verifiers.answer_match:AnswerMatch"] * 2, "unique"),
    ]


def verifier_cases() -> list[VerifierCase]:
    return [
        VerifierCase("verifier.crash", "verifier crash", "verify() raises", "processors.testing:CrashingVerifier",
                     "ERROR", "verifier bug"),
        VerifierCase("verifier.crash_in_process", "verifier crash", "verify() raises in an isolated process",
                     {"ref": "processors.testing:CrashingVerifier", "isolation": "process"}, "ERROR", "verifier bug"),
        VerifierCase("verifier.process_exit", "verifier crash", "the verifier's process exits (like a segfault)",
                     {"ref": "processors.testing:ExitingVerifier", "isolation": "process"}, "ERROR", "died"),
        VerifierCase("verifier.nan", "verifier crash", "returns NaN (not JSON)", "processors.testing:NaNVerifier",
                     "ERROR", "no exact JSON form"),
        VerifierCase("verifier.timeout", "verifier timeout", "sleeps past its time limit (thread)",
                     "processors.testing:SleepingVerifier", "TIMEOUT", "did not return"),
        VerifierCase("verifier.timeout_process", "verifier timeout", "sleeps past its time limit (process, killed)",
                     {"ref": "processors.testing:SleepingVerifier", "isolation": "process", "timeout_s": 0.5},
                     "TIMEOUT", "killed"),
    ]


def corpus_size(model: str = "m") -> int:
    return (len(http_cases(model)) + len(security_cases(model)) + len(topic_cases()) + len(config_cases())
            + len(verifier_cases()))
