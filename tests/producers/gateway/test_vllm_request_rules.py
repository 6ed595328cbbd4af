"""Where vLLM 0.32 prepares a request for a chat template otherwise than the client sent it, the gateway does the
same, whichever protocol and family, so a harness gets the same prompt from tokentrail as from vLLM:

- tools keep ``strict`` and ``defer_loading`` (vLLM's ``ChatCompletionToolsParam.model_dump()``, built by its
  chat, Responses and Anthropic endpoints alike; Pi and Codex send ``"strict": false``, Claude Code
  ``"defer_loading": true`` on deferred tools, and Qwen3-Coder's template prints both);
- Claude Code's ``x-anthropic-billing-header`` is kept out of the prompt: vLLM's /v1/messages drops a system
  block that starts with it (``AnthropicServingMessages._convert_system_message`` / ``_extract_system_text``),
  and its chat render drops the first line of any system text that starts with it
  (``renderers/chat_utils.py`` ``_strip_claude_code_billing_header``);
- Anthropic text blocks are joined as vLLM's /v1/messages joins them (system blocks end to end, a turn's text
  blocks with a newline), and OpenAI chat text parts as vLLM's chat render joins them (a newline, empty parts
  skipped).

vLLM itself renders such requests in tests/conformance/test_vllm_parsers.py (slow); these are the rules."""

from __future__ import annotations

from typing import Any

from producers.families.messages import template_messages
from producers.gateway import anthropic_adapter, openai_adapter, responses_adapter
from producers.gateway.body import validate
from producers.gateway.models_anthropic import MessagesRequest
from producers.gateway.models_openai import ChatCompletionRequest
from producers.gateway.models_responses import ResponsesRequest

BILLING = "x-anthropic-billing-header: cc_version=2.1.328.593; cc_entrypoint=sdk-cli; cch=5e1f2;"
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
STRICT_READ = {"name": "read", "description": "Read a file.", "parameters": SCHEMA, "strict": False}


def _functions(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    assert tools is not None
    return [t["function"] for t in tools]


def test_tools_keep_strict_in_every_protocol_in_vllms_key_order() -> None:
    chat = openai_adapter.chat_to_internal(validate(ChatCompletionRequest, {
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": STRICT_READ},
                  {"type": "function", "function": {"name": "ls", "parameters": SCHEMA}}]}), 100)
    responses = responses_adapter.to_internal(validate(ResponsesRequest, {
        "model": "m", "input": "hi", "tools": [{"type": "function", **STRICT_READ}]}), 100)
    anthropic = anthropic_adapter.to_internal(validate(MessagesRequest, {
        "model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "read", "description": "Read a file.", "input_schema": SCHEMA, "strict": False}]}), 100)
    for call in (chat, responses, anthropic):
        first = _functions(call.tools)[0]
        assert first == STRICT_READ and list(first) == ["name", "description", "parameters", "strict"]
    assert _functions(chat.tools)[1] == {"name": "ls", "parameters": SCHEMA}  # not set: not rendered (as vLLM)


def test_deferred_tools_keep_defer_loading_as_vllm_passes_it_on() -> None:
    # Claude Code marks its deferred tools; vLLM's /v1/messages passes the field on and templates print it
    anthropic = anthropic_adapter.to_internal(validate(MessagesRequest, {
        "model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "cron", "description": "Schedule.", "input_schema": SCHEMA, "defer_loading": True}]}), 100)
    assert anthropic.tools == [{"type": "function", "function": {
        "name": "cron", "description": "Schedule.", "parameters": SCHEMA, "defer_loading": True}}]
    # OpenAI chat: a tool-level flag is also the function's (vLLM's ChatCompletionToolsParam), and kept on the tool
    chat = openai_adapter.chat_to_internal(validate(ChatCompletionRequest, {
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "ls", "parameters": SCHEMA}, "defer_loading": True}]}),
        100)
    assert chat.tools == [{"type": "function", "function": {"name": "ls", "parameters": SCHEMA, "defer_loading": True},
                           "defer_loading": True}]


def test_anthropic_drops_claude_codes_billing_block_as_vllms_messages_endpoint_does() -> None:
    req = validate(MessagesRequest, {"model": "m", "max_tokens": 10, "system": [
        {"type": "text", "text": BILLING},
        {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "\nBe brief."}], "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": BILLING},
        {"role": "system", "content": [{"type": "text", "text": BILLING}, {"type": "text", "text": "Now: 5 pm."}]},
        {"role": "user", "content": f"{BILLING} is kept in a user turn"}]})
    assert anthropic_adapter.to_internal(req, 100).messages == [
        {"role": "system", "content": "You are a Claude agent.\nBe brief."},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Now: 5 pm."},
        {"role": "user", "content": f"{BILLING} is kept in a user turn"}]
    only = validate(MessagesRequest, {"model": "m", "max_tokens": 10, "system": [{"type": "text", "text": BILLING}],
                                      "messages": [{"role": "user", "content": "hi"}]})
    assert anthropic_adapter.to_internal(only, 100).messages == [{"role": "user", "content": "hi"}]


def test_anthropic_text_blocks_are_joined_as_vllms_messages_endpoint_joins_them() -> None:
    # system blocks end to end; a turn's text blocks (user, assistant, a tool result's) with one newline, as vLLM's
    # chat render joins the parts its /v1/messages keeps; empty text blocks skipped
    req = validate(MessagesRequest, {"model": "m", "max_tokens": 10, "system": [
        {"type": "text", "text": "A."}, {"type": "text", "text": ""}, {"type": "text", "text": "B."}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<reminder/>"}, {"type": "text", "text": ""},
                                     {"type": "text", "text": "Do it."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "out"}, {"type": "text", "text": "err"}]}]}]})
    assert anthropic_adapter.to_internal(req, 100).messages == [
        {"role": "system", "content": "A.B."}, {"role": "user", "content": "<reminder/>\nDo it."},
        {"role": "assistant", "content": "One.\nTwo."}, {"role": "tool", "tool_call_id": "t1", "content": "out\nerr"}]


def test_openai_chat_text_parts_are_joined_as_vllms_chat_render_joins_them() -> None:
    # one newline between parts, empty parts skipped (vLLM's string content format); before: "" ("AB", "HiThere")
    req = validate(ChatCompletionRequest, {"model": "m", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "A."}, {"type": "text", "text": "B."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": ""},
                                     {"type": "text", "text": "There"}]},
        {"role": "user", "content": [{"type": "text", "text": "one part"}]}]})
    assert [m["content"] for m in openai_adapter.chat_to_internal(req, 100).messages] == [
        "A.\nB.", "Hi\nThere", "one part"]


def test_a_system_text_that_starts_with_the_billing_header_loses_that_line_before_the_template() -> None:
    messages = [
        {"role": "system", "content": f"{BILLING}\nYou are Pi.\nBe brief."},
        {"role": "system", "content": [{"type": "text", "text": BILLING}, {"type": "text", "text": "Tools: read."}]},
        {"role": "system", "content": BILLING},
        {"role": "system", "content": f"Note: {BILLING}\nstays (not at the start)"},
        {"role": "user", "content": f"{BILLING}\nstays (a user turn)"},
    ]
    assert [m["content"] for m in template_messages(messages)] == [
        "You are Pi.\nBe brief.", "Tools: read.", "", f"Note: {BILLING}\nstays (not at the start)",
        f"{BILLING}\nstays (a user turn)"]
    assert messages[0]["content"].startswith(BILLING)  # the request's own messages are kept as sent
