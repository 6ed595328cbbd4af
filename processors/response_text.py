"""The assistant's text from a call's ``response_json``, whatever protocol returned it.

Verifiers read text, while a rollout carries token ids; the assembler extracts the text once, when
the call arrives, so the heavy response body never has to be kept. Handles OpenAI Chat Completions,
Completions and Responses objects, Anthropic Messages, and streamed responses stored either as the
list of chunks/events or as an SSE transcript (``data: {...}`` lines).
"""

from __future__ import annotations

from typing import Any

import orjson


def response_text(response_json: str) -> str:
    """Concatenated assistant text of one response; "" when it has none (e.g. only tool calls)."""
    if not response_json:
        return ""
    try:
        value = orjson.loads(response_json)
    except orjson.JSONDecodeError:
        return _sse_text(response_json)
    return _text_of(value)


def _sse_text(body: str) -> str:
    events: list[Any] = []
    for line in body.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if not data or data == "[DONE]":
            continue
        try:
            events.append(orjson.loads(data))
        except orjson.JSONDecodeError:
            continue
    return _text_of(events)


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_chunk_text(item) for item in value)
    if isinstance(value, dict):
        if isinstance(value.get("chunks"), list):  # a wrapper around streamed chunks
            return _text_of(value["chunks"])
        if isinstance(value.get("events"), list):
            return _text_of(value["events"])
        return _object_text(value)
    return ""


def _object_text(obj: dict[str, Any]) -> str:
    choices = obj.get("choices")
    if isinstance(choices, list) and choices:
        choice = choices[0] if isinstance(choices[0], dict) else {}
        message = choice.get("message")
        if isinstance(message, dict):
            return _content_text(message.get("content"))
        if isinstance(choice.get("text"), str):  # completions
            return choice["text"]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            return _content_text(delta.get("content"))
        return ""
    if obj.get("type") == "message" or ("content" in obj and "role" in obj):  # anthropic / message
        return _content_text(obj.get("content"))
    if isinstance(obj.get("output"), list):  # openai responses
        parts = []
        for item in obj["output"]:
            if isinstance(item, dict) and item.get("type") == "message":
                parts.append(_content_text(item.get("content")))
        return "".join(parts)
    if isinstance(obj.get("output_text"), str):
        return obj["output_text"]
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and block.get("type") in ("text", "output_text"):
                parts.append(str(block.get("text", "")))
        return "".join(parts)
    return ""


def _chunk_text(chunk: Any) -> str:
    """One streamed chunk: OpenAI chat/completions chunk, Anthropic or Responses stream event."""
    if not isinstance(chunk, dict):
        return ""
    kind = chunk.get("type")
    if kind == "content_block_delta":
        delta = chunk.get("delta") or {}
        return str(delta.get("text", "")) if delta.get("type") == "text_delta" else ""
    if kind == "response.output_text.delta":
        return str(chunk.get("delta", ""))
    if isinstance(kind, str) and kind not in ("message",):
        return ""  # other typed stream events carry no new text
    return _object_text(chunk)
