"""Output parser: sampled text -> content, reasoning and hermes tool calls.

The format is what the reference chat template renders for an assistant turn, so that
``parse(render(message)) == message`` and a parsed output re-renders to the sampled text:

    [<think>\\n{reasoning}\\n</think>\\n\\n]{content}
    [\\n]<tool_call>\\n{"name": .., "arguments": ..}\\n</tool_call>   (per tool call)

Separators the template adds (one newline after ``<think>`` and before ``</think>``, two after
``</think>``, one before each tool call block) are removed exactly once; anything else is kept
verbatim. A ``<tool_call>`` block whose body is not a JSON object with a string ``name`` (or that is
never closed) stays in the content, and ``errors`` says why. The parser is a pure function of the
text; its version is recorded with every call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

PARSER_VERSION = "hermes-think/1"

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
_MARKERS = (THINK_OPEN, THINK_CLOSE, TOOL_OPEN, TOOL_CLOSE)
# The template's block form; used to keep the arguments text verbatim when the block has that form.
_TEMPLATE_BODY = re.compile(r'\A\{"name": ("(?:[^"\\]|\\.)*"), "arguments": (.*)\}\Z', re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object, as OpenAI's function.arguments


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()

    def to_message(self, tool_call_ids: list[str] | None = None) -> dict[str, Any]:
        """The OpenAI chat assistant message (``reasoning_content`` only when there is reasoning)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            ids = tool_call_ids or [f"call_{i}" for i in range(len(self.tool_calls))]
            message["tool_calls"] = [
                {"id": ids[i], "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in enumerate(self.tool_calls)
            ]
        return message


def parse_output(text: str) -> ParsedOutput:
    """Parse one complete assistant output (decoded without its final stop token)."""
    reasoning, rest = _split_reasoning(text)
    content, calls, errors = _split_tool_calls(rest)
    return ParsedOutput(content=content or None, reasoning=reasoning, tool_calls=tuple(calls),
                        errors=tuple(errors))


def _split_reasoning(text: str) -> tuple[str | None, str]:
    if not text.startswith(THINK_OPEN):
        return None, text
    body = text[len(THINK_OPEN):]
    end = body.find(THINK_CLOSE)
    if end < 0:  # cut off while thinking: all of it is reasoning
        return _strip_once(body, "\n", "\n"), ""
    reasoning = _strip_once(body[:end], "\n", "\n")
    rest = body[end + len(THINK_CLOSE):]
    return reasoning, rest.removeprefix("\n\n")


def _strip_once(text: str, prefix: str, suffix: str) -> str:
    return text.removeprefix(prefix).removesuffix(suffix)


def _split_tool_calls(text: str) -> tuple[str, list[ToolCall], list[str]]:
    content: list[str] = []
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    while True:
        start = text.find(TOOL_OPEN, pos)
        if start < 0:
            content.append(text[pos:])
            break
        end = text.find(TOOL_CLOSE, start + len(TOOL_OPEN))
        if end < 0:
            errors.append(f"unterminated {TOOL_OPEN} at character {start}")
            content.append(text[pos:])
            break
        block_end = end + len(TOOL_CLOSE)
        call, error = _parse_block(text[start + len(TOOL_OPEN):end])
        if call is None:
            errors.append(f"tool call at character {start}: {error}")
            content.append(text[pos:block_end])
        else:
            # The template puts one newline before a block unless the block opens the message.
            content.append(text[pos:start].removesuffix("\n"))
            calls.append(call)
        pos = block_end
    return "".join(content), calls, errors


def _parse_block(body: str) -> tuple[ToolCall | None, str]:
    stripped = body.strip()
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON ({exc.msg})"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None, 'expected a JSON object with a string "name"'
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, "arguments is a string that is not JSON"
    if not isinstance(arguments, dict):
        return None, "arguments is not a JSON object"
    match = _TEMPLATE_BODY.match(stripped)
    if match and set(value) <= {"name", "arguments"} and _json_equal(match.group(2), value.get("arguments")):
        return ToolCall(value["name"], match.group(2)), ""
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False)), ""


def _json_equal(text: str, expected: Any) -> bool:
    try:
        return json.loads(text) == expected and isinstance(expected, dict)
    except json.JSONDecodeError:
        return False


# ------------------------------------------------------------------------------------------ streaming
@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A complete tool call (blocks are emitted whole, once their closing marker arrives)."""

    index: int
    name: str
    arguments: str


StreamEvent = ContentDelta | ReasoningDelta | ToolCallDelta


@dataclass
class StreamingParser:
    """Incremental twin of :func:`parse_output`.

    ``feed`` returns the events that are already certain; ``finish`` returns the rest and the final
    parse. Concatenated deltas always equal the final parse (text that could still change meaning —
    a partial marker, trailing newlines that may turn out to be separators, an open tool-call block —
    is held back until it is decided)."""

    _text: str = ""
    _content: str = ""
    _reasoning: str = ""
    _calls: int = 0
    _events: list[StreamEvent] = field(default_factory=list)

    def feed(self, delta: str) -> list[StreamEvent]:
        self._text += delta
        return self._advance(parse_output(_settled_prefix(self._text)))

    def finish(self) -> tuple[list[StreamEvent], ParsedOutput]:
        final = parse_output(self._text)
        return self._advance(final), final

    def _advance(self, parsed: ParsedOutput) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        reasoning = parsed.reasoning or ""
        content = parsed.content or ""
        if not reasoning.startswith(self._reasoning) or not content.startswith(self._content):
            raise AssertionError("streaming parser emitted text that the final parse does not contain")
        if len(reasoning) > len(self._reasoning):
            events.append(ReasoningDelta(reasoning[len(self._reasoning):]))
            self._reasoning = reasoning
        if len(content) > len(self._content):
            events.append(ContentDelta(content[len(self._content):]))
            self._content = content
        for index in range(self._calls, len(parsed.tool_calls)):
            call = parsed.tool_calls[index]
            events.append(ToolCallDelta(index, call.name, call.arguments))
        self._calls = max(self._calls, len(parsed.tool_calls))
        return events


def _settled_prefix(text: str) -> str:
    """The longest prefix of ``text`` whose parse cannot change when more text arrives."""
    last_open = text.rfind(TOOL_OPEN)
    if last_open >= 0 and text.find(TOOL_CLOSE, last_open) < 0:
        # An open tool-call block: everything from it on is undecided, everything before it is not.
        text = text[:last_open]
    else:
        # A partial marker at the very end ("<too") may still become a marker.
        for cut in range(min(len(text), max(map(len, _MARKERS)) - 1), 0, -1):
            tail = text[-cut:]
            if any(marker.startswith(tail) for marker in _MARKERS):
                text = text[:-cut]
                break
    # Trailing newlines may be separators the template adds before a block or </think>.
    return text.rstrip("\n")
