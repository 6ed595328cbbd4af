"""A lower bound on a conversation's prompt tokens, read from its structure before anything is rendered.

Rendering (a chat template, then the tokenizer) is the costliest step of a call per request byte, and it runs
on the serving event loop: a request of tens of thousands of tiny messages, tool calls or tool declarations
costs seconds there while every other call on the worker waits (issue 29, fault (o)), only to be refused for
its length afterwards. Every chat template renders each message, each tool call and each declared tool as at
least one token (a role marker, the call's name, the tool's name), so their count is a floor on the prompt's
length; and the text of the messages takes at least its bytes over the longest token's bytes (with a
factor of 4 to spare for normalizers and templates that trim). A conversation whose floor is already past
the model's context is refused before it is rendered, with the error the rendered prompt would have got."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from producers.gateway.chat import InternalCall
from producers.gateway.errors import GatewayError


@dataclass(frozen=True)
class StructureLimit:
    """What a conversation's structure is measured against: the model's context, and the longest token's
    bytes (0: text is not counted)."""

    context: int
    max_token_bytes: int = 0


# Content blocks that become a message or a tool call of their own (text blocks may be empty and join others).
_STRUCTURAL_BLOCKS = frozenset({"tool_use", "tool_result", "function_call", "custom_tool_call",
                                "function_call_output", "custom_tool_call_output"})


def min_prompt_tokens(call: InternalCall) -> int:
    """At least this many tokens in the rendered prompt (0 for a call that is not a conversation)."""
    if call.messages is None:
        return 0
    calls = sum(len(m.get("tool_calls") or ()) for m in call.messages)
    return len(call.messages) + calls + len(call.tools or ())


TEXT_SLACK = 4


def _text_bytes(value: Any) -> int:
    """UTF-8 bytes of the text a message or system field carries (a string, or text blocks), trimmed."""
    if isinstance(value, str):
        return len(value.strip().encode())
    if isinstance(value, list):
        return sum(_text_bytes(b.get("text")) for b in value if isinstance(b, dict))
    return 0


def min_prompt_tokens_raw(body: dict[str, Any], max_token_bytes: int = 0) -> int:
    """The same floor from a request body as sent (Chat Completions, Responses, Anthropic Messages), before
    it is validated: validating tens of thousands of items costs the event loop more than counting them, and
    tokenizing megabytes of text more than measuring it. ``max_token_bytes``: 0 counts no text."""
    floor = len(body["tools"]) if isinstance(body.get("tools"), list) else 0
    text = _text_bytes(body.get("system")) + _text_bytes(body.get("instructions"))
    if isinstance(body.get("input"), str):
        text += _text_bytes(body["input"])
    for key in ("messages", "input"):
        items = body.get(key)
        if not isinstance(items, list):
            continue
        floor += len(items)
        for item in items:
            if not isinstance(item, dict):
                continue
            calls, content = item.get("tool_calls"), item.get("content")
            floor += len(calls) if isinstance(calls, list) else 0
            text += _text_bytes(content)
            if isinstance(content, list):
                floor += sum(1 for b in content if isinstance(b, dict) and b.get("type") in _STRUCTURAL_BLOCKS)
    if max_token_bytes > 0:
        floor += text // (TEXT_SLACK * max_token_bytes)
    return floor


def structure_error(floor: int, context: int) -> GatewayError | None:
    """The refusal of a conversation whose structure alone (``floor`` tokens) is longer than the context."""
    if floor < context:
        return None
    return GatewayError(400, f"This model's maximum context length is {context} tokens; the prompt has at least "
                        f"{floor} (one per message, tool call and tool), which leaves no room for output",
                        "invalid_request", param="messages", code="context_length_exceeded")
