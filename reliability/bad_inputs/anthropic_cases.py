"""Anthropic Messages requests the gateway must refuse (or serve) in Anthropic's error shape."""

from __future__ import annotations

from typing import Any

# Short local names: each row of the tables below states its expected answer with one of them.
from reliability.bad_inputs.http_case import HttpCase, HttpExpect
from reliability.bad_inputs.http_case import anthropic_error as an
from reliability.bad_inputs.limits import CORPUS_MAX_TOKENS, HUGE


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
        c("json.not_json", "malformed JSON", "plain text body", an(400), raw=b"not json"),
        c("json.truncated", "malformed JSON", "body cut mid-object", an(400), raw=b'{"model": "m", "max'),
        c("json.empty", "malformed JSON", "empty body", an(400), raw=b""),
        c("json.array", "malformed JSON", "top-level array", an(400), [req()]),
        c("json.nan_literal", "malformed JSON", "NaN literal", an(400),
          raw=b'{"model": "m", "max_tokens": 2, "messages": [], "temperature": NaN}'),
        c("utf8.invalid_bytes", "non-UTF-8", "a lone 0xff byte", an(400), raw=b"\xff"),
        c("utf8.latin1", "non-UTF-8", "latin-1 encoded body", an(400),
          raw='{"model": "\u00e9t\u00e9", "max_tokens": 2}'.encode("latin-1")),
        c("huge.content", "huge body", "one message over the body limit", an(413, "request_too_large"),
          req(messages=[{"role": "user", "content": HUGE}])),
        c("missing.max_tokens", "missing field", "max_tokens is required", an(400, contains="max_tokens"),
          {"model": model, "messages": user}),
        c("missing.messages", "missing messages", "no messages", an(400, contains="messages"),
          {"model": model, "max_tokens": 2}),
        c("empty.messages", "missing messages", "messages = []", an(400, contains="messages"), req(messages=[])),
        c("type.max_tokens", "wrong type", "max_tokens is a word", an(400, contains="max_tokens"),
          req(max_tokens="ten")),
        c("type.content", "wrong type", "content is a number", an(400, contains="content"),
          req(messages=[{"role": "user", "content": 42}])),
        c("type.system", "wrong type", "system is a number", an(400, contains="system"), req(system=5)),
        c("type.stream", "wrong type", "stream is 'maybe'", an(400, contains="stream"), req(stream="maybe")),
        c("type.stop_sequences", "wrong type", "stop_sequences is a string", an(400, contains="stop_sequences"),
          req(stop_sequences="END")),
        c("model.unknown", "unknown model", "model claude-opus-9", an(404, "not_found_error"),
          req(model="claude-opus-9")),
        c("max_tokens.over_limit", "max_tokens too large", "one over the gateway limit: served with the limit",
          an(200), req(max_tokens=CORPUS_MAX_TOKENS + 1)),
        c("max_tokens.claude_code", "max_tokens too large", "max_tokens 64000, as Claude Code sends: served with "
          "what fits", an(200), req(max_tokens=64000)),
        c("max_tokens.zero", "max_tokens too large", "max_tokens 0", an(400, contains="max_tokens"),
          req(max_tokens=0)),
        c("role.system", "harness shape", "role 'system' inside messages, as Claude Code sends its per-turn "
          "context: rendered as a system turn where it stands", an(200),
          req(messages=[*user, {"role": "system", "content": "x"}])),
        c("role.system_image", "bad role", "an image block in a 'system' message (text-only model)", an(400),
          req(messages=[*user, {"role": "system", "content": [{"type": "image", "source": {}}]}])),
        c("role.tool", "bad role", "role 'tool' (an OpenAI role)", an(400, contains="role"),
          req(messages=[{"role": "tool", "content": "x"}])),
        c("content.document", "bad role", "document block (text-only model)", an(400),
          req(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}])),
        c("content.image", "bad role", "image block (text-only model)", an(400),
          req(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])),
        c("content.tool_use_no_id", "bad tool schema", "tool_use block without id", an(400, contains="id"),
          req(messages=[*user, {"role": "assistant", "content": [
              {"type": "tool_use", "name": "lookup", "input": {}}]}])),
        c("content.tool_result_no_id", "bad tool schema", "tool_result without tool_use_id",
          an(400, contains="messages.0.content"),
          req(messages=[{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}])),
        c("tools.not_list", "bad tool schema", "tools is a string", an(400, contains="tools"), req(tools="x")),
        c("tools.empty_name", "bad tool schema", "tool name ''", an(400, contains="tools.0.name"),
          req(tools=[{"name": "", "input_schema": {}}])),
        c("tools.schema_string", "bad tool schema", "input_schema is a string",
          an(400, contains="tools.0.input_schema"), req(tools=[{"name": "t", "input_schema": "object"}])),
        c("tools.server_tool", "bad tool schema", "server tool (web_search)", an(400),
          req(tools=[{"type": "web_search_20250305", "name": "web_search"}])),
        c("tool_choice.unknown_type", "bad tool_choice", "tool_choice type 'whatever'",
          an(400, contains="tool_choice"), req(tools=[tool], tool_choice={"type": "whatever"})),
        c("tool_choice.string", "bad tool_choice", "tool_choice 'auto' as a bare string",
          an(400, contains="tool_choice"), req(tools=[tool], tool_choice="auto")),
        c("tool_choice.tool_without_name", "bad tool_choice", "type 'tool' without a name",
          an(400, contains="tool_choice"), req(tools=[tool], tool_choice={"type": "tool"}),
          gap="accepted (200): tool_choice type 'tool' needs a name that is among the tools"),
        c("temperature.negative", "bad sampling", "temperature -1", an(400, contains="temperature"),
          req(temperature=-1)),
        c("temperature.above_one", "bad sampling", "temperature 1.5 (Anthropic range 0..1)",
          an(400, contains="temperature"), req(temperature=1.5)),
        c("temperature.nan", "bad sampling", "temperature 'NaN'", an(400, contains="temperature"),
          req(temperature="NaN")),
        c("top_p.zero", "bad sampling", "top_p 0", an(400, contains="top_p"), req(top_p=0)),
        c("top_k.negative", "bad sampling", "top_k -1", an(400, contains="top_k"), req(top_k=-1)),
        c("count_tokens.document", "bad role", "count_tokens with a document block", an(400),
          {"model": model, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
          path="/v1/messages/count_tokens"),
        c("count_tokens.no_messages", "missing messages", "count_tokens without messages",
          an(400, contains="messages"), {"model": model}, path="/v1/messages/count_tokens"),
        c("route.unknown", "bad route", "unknown path under /v1/messages", an(404, "not_found_error"), {},
          path="/v1/messages/nothing"),
        c("identity.finished_attempt", "events after finish", "a message on a finished attempt",
          an(409), req(), path="/rollouts/{done}/v1/messages"),
    ]
