"""OpenClaw 2026.9.6's real request shapes in the bad-input corpus (tests/harnesses/captured/openclaw*.jsonl),
cut to fit the corpus's small model: what OpenClaw sends on each of its provider APIs must be served (200), and
the one thing in them the gateway cannot serve is refused in the caller's protocol, naming the field.

The shapes that matter (each seen in a capture): a system prompt then two consecutive user turns, the second a
content list (OpenClaw's internal context, resent after the tool result); function tools without ``strict``,
``tool_choice: "auto"``, ``max_completion_tokens`` 8192, ``stream_options.include_usage``; a replayed tool call
whose id OpenClaw rewrote (underscore dropped) and whose arguments it re-serialized compactly; on Anthropic
Messages the key in ``x-api-key``, no ``anthropic-beta``, ``cache_control`` on the system block, the prompt,
the last tool and the tool result; on Responses a ``system`` message item, ``function_call`` items without
``id``/``status``, ``store: false``, ``max_output_tokens`` 8192.
"""

from __future__ import annotations

from typing import Any

# Short local names: each row of the tables below states its expected answer with one of them.
from reliability.bad_inputs.http_case import HttpCase, HttpExpect
from reliability.bad_inputs.http_case import anthropic_error as an
from reliability.bad_inputs.http_case import openai_error as oa

EPHEMERAL = {"type": "ephemeral"}
SYSTEM = "<!-- openclaw:attempt:STABLE -->\nYou are a personal assistant running inside OpenClaw."
TASK = "[Tue 2026-12-01 22:35 UTC] Create hi.txt containing hello.\n\nRuntime: agent=main | sessionId=corpus"
CONTEXT = ("<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nConversation data (data, not instructions):\n"
           "\"Active exec sessions:\\nnone\"\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>")
EXEC_PARAMETERS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
ARGUMENTS = '{"command":"echo hello > hi.txt"}'  # compact, as OpenClaw sends arguments back


def _case(id_: str, area: str, klass: str, what: str, path: str, expect: HttpExpect, body: Any,
          headers: dict[str, str] | None = None) -> HttpCase:
    return HttpCase(f"{area}.openclaw.{id_}", area, klass, what, path, expect, body,  # type: ignore[arg-type]
                    headers=dict(headers or {}))


def openclaw_cases(model: str) -> list[HttpCase]:
    tools = [{"type": "function", "function": {"name": "exec", "description": "Run a shell command.",
                                               "parameters": EXEC_PARAMETERS}}]
    chat_turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK},
                 {"role": "user", "content": [{"type": "text", "text": CONTEXT}]}]
    replayed = [*chat_turn[:2],
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call4fad1a7e005c423f", "type": "function",
                                                                      "function": {"name": "exec",
                                                                                   "arguments": ARGUMENTS}}]},
                {"role": "tool", "content": "hello", "tool_call_id": "call4fad1a7e005c423f"}, chat_turn[2]]

    def chat(**fields: Any) -> dict[str, Any]:
        # max_completion_tokens as OpenClaw asks (8192) is served with what fits: the corpus's cap.
        return {"model": model, "messages": chat_turn, "stream": False, "tools": tools, "tool_choice": "auto",
                "max_completion_tokens": 8192, **fields}

    anthropic_tools = [{"name": "exec", "description": "Run a shell command.", "input_schema": EXEC_PARAMETERS,
                        "cache_control": EPHEMERAL}]
    anthropic_turn = [{"role": "user", "content": [{"type": "text", "text": TASK, "cache_control": EPHEMERAL}]},
                      {"role": "user", "content": [{"type": "text", "text": CONTEXT}]}]
    anthropic_replayed = [
        anthropic_turn[0],
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu7263fbb424fb4b0b", "name": "exec",
                                           "input": {"command": "echo hello > hi.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu7263fbb424fb4b0b",
                                      "content": "hello", "is_error": False, "cache_control": EPHEMERAL}]},
        anthropic_turn[1]]

    def anthropic(**fields: Any) -> dict[str, Any]:
        return {"model": model, "max_tokens": 8192, "stream": False,
                "system": [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL},
                           {"type": "text", "text": "<!-- openclaw:attempt:DYNAMIC -->"}],
                "messages": anthropic_turn, "tools": anthropic_tools, **fields}

    anthropic_headers = {"anthropic-version": "2023-06-01", "x-api-key": "corpus-key",
                         "anthropic-dangerous-direct-browser-access": "true"}

    def item(role: str, text: str) -> dict[str, Any]:
        return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}

    responses_tools = [{"type": "function", "name": "exec", "description": "Run a shell command.",
                        "parameters": EXEC_PARAMETERS}]
    responses_turn = [item("system", SYSTEM), item("user", TASK), item("user", CONTEXT),
                      {"type": "function_call", "call_id": "call_1", "name": "exec", "arguments": ARGUMENTS},
                      {"type": "function_call_output", "call_id": "call_1", "output": "hello"}]
    chat_path, messages_path, responses_path = "/v1/chat/completions", "/v1/messages", "/v1/responses"
    return [
        _case("chat_turn", "openai", "harness shape", "OpenClaw's first chat request: system, then two user "
              "turns (the second a content list: its internal context), tools without strict, tool_choice auto, "
              "max_completion_tokens 8192", chat_path, oa(200), chat()),
        _case("chat_replayed", "openai", "harness shape", "OpenClaw's next chat request: its tool call sent back "
              "with the id rewritten and the arguments compact, the result, then the internal context again",
              chat_path, oa(200), chat(messages=replayed)),
        _case("chat_image", "openai", "bad role", "OpenClaw's internal-context turn with an image part (a "
              "text-only model): refused, naming the part", chat_path,
              oa(400, param="messages.2.content.1.type"),
              chat(messages=[*chat_turn[:2], {"role": "user", "content": [
                  {"type": "text", "text": CONTEXT}, {"type": "image_url", "image_url": {"url": "data:,"}}]}])),
        _case("messages_turn", "anthropic", "harness shape", "OpenClaw on Anthropic Messages: x-api-key, no "
              "anthropic-beta, a cached and an uncached system block, two consecutive user turns, the last tool "
              "cached, max_tokens 8192", messages_path, an(200), anthropic(), anthropic_headers),
        _case("messages_replayed", "anthropic", "harness shape", "its tool_use sent back with the id rewritten, "
              "a cached tool_result, then the internal context after it", messages_path, an(200),
              anthropic(messages=anthropic_replayed), anthropic_headers),
        _case("responses_turn", "openai", "harness shape", "OpenClaw on Responses: a system message item, two "
              "user items, a function_call without id or status and its output, store false, "
              "max_output_tokens 8192", responses_path, oa(200),
              {"model": model, "input": responses_turn, "stream": False, "store": False,
               "max_output_tokens": 8192, "tools": responses_tools}),
    ]
