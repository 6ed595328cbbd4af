"""A request's messages as vLLM's chat preprocessing hands them to a family's chat template, so the
gateway renders what vLLM (serving the same template) renders:

- text content parts are joined with newlines into one string, and no content becomes "" (the real
  templates concatenate ``message.content`` as a string);
- an assistant message's ``reasoning`` (or ``reasoning_content``) is passed as both names, and as
  ``thinking`` to templates that read that name (gpt-oss's: vLLM hands gpt-oss's reasoning to harmony as
  the analysis message, which the template renders from ``thinking``);
- tool-call ``arguments`` given as JSON text are parsed into objects (the templates re-serialize them
  with ``tojson``, or iterate them as Qwen3-Coder's does); text that is not a JSON object is left as is;
- a system message's text that starts with Claude Code's ``x-anthropic-billing-header`` loses that first
  line (vLLM 0.32: ``renderers/chat_utils.py`` ``_strip_claude_code_billing_header``, on every system
  message of every chat-template family): the line carries a hash that changes on every request, so vLLM
  keeps it out of the prompt (and its prefix cache); the gateway keeps it out of the prompt and the splice.
  vLLM's /v1/messages drops the whole block before that (``AnthropicServingMessages``), as the gateway's
  Anthropic adapter does with ``is_billing_header``.

Tools are prepared where the protocols declare them (``producers.gateway.chat.function_tool``: ``strict``
kept, as vLLM keeps it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

BILLING_HEADER = "x-anthropic-billing-header"


def is_billing_header(text: Any) -> bool:
    """Whether a system text is Claude Code's attribution line, by vLLM's test (its start)."""
    return isinstance(text, str) and text.startswith(BILLING_HEADER)


def _without_billing_line(content: Any) -> Any:
    """A system message's content less the billing header's line, as vLLM strips it: in each text (a string,
    or a text part) that starts with the header, the text after its first newline; nothing left, the part
    goes."""
    if isinstance(content, str):
        return content.partition("\n")[2] if is_billing_header(content) else content
    if not isinstance(content, list):
        return content
    out = []
    for part in content:
        text = part if isinstance(part, str) else part.get("text") if isinstance(part, Mapping) and \
            part.get("type") == "text" else None
        if not is_billing_header(text):
            out.append(part)
            continue
        rest = str(text).partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _content_text(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, str) or not isinstance(content, Sequence):
        return content
    if all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "\n".join(str(p.get("text", "")) for p in content)
    return content  # other parts (images, tool references) stay structured, as in vLLM


def _tool_call(call: Any) -> Any:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            function["arguments"] = parsed
    return {**call, "function": function}


def template_messages(messages: Sequence[Mapping[str, Any]], *, thinking_key: bool = False) -> list[dict[str, Any]]:
    """``messages`` prepared as vLLM prepares them for a chat template (new dicts; the input is kept)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        prepared = dict(message)
        content = message.get("content")
        if message.get("role") == "system":
            content = _without_billing_line(content)
        prepared["content"] = _content_text(content)
        if message.get("role") == "assistant":
            reasoning = message.get("reasoning", message.get("reasoning_content"))
            if reasoning is not None:
                prepared["reasoning"] = prepared["reasoning_content"] = reasoning
                if thinking_key:
                    prepared["thinking"] = reasoning
            calls = message.get("tool_calls")
            if isinstance(calls, list):
                if calls:
                    prepared["tool_calls"] = [_tool_call(c) for c in calls]
                else:
                    prepared.pop("tool_calls")
        out.append(prepared)
    return out
