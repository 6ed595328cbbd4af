"""Streaming a family's output: reasoning and content deltas, found by parsing the part of the text so far
whose parse can no longer change (``settled``), with the family's own parser, so the deltas always add
up to the final parse. Tool calls are sent with the outcome (as for the reference model).

What is settled, per family: for the Qwen formats, the text before an unclosed ``<tool_call>`` and before a
partial marker at the end; for llama3, nothing while the output may still be a JSON tool call (it starts
with ``{`` or ``<|python_tag|>``), else all of it; for harmony, the text up to the last closed message
(``<|end|>``), so deltas come a message at a time.
"""

from __future__ import annotations

from collections.abc import Callable

from producers.families.formats import FamilyParse

TextEvent = tuple[str, str]

_QWEN_MARKERS = ("<tool_call>", "</tool_call>", "<think>", "</think>")


def _settled_qwen(text: str) -> str:
    last_open = text.rfind("<tool_call>")
    if last_open >= 0 and text.find("</tool_call>", last_open) < 0:
        return text[:last_open].rstrip("\n")
    for cut in range(min(len(text), max(map(len, _QWEN_MARKERS)) - 1), 0, -1):
        if any(marker.startswith(text[-cut:]) for marker in _QWEN_MARKERS):
            return text[:-cut].rstrip("\n")
    return text.rstrip("\n")  # trailing newlines may be the separators before a block or </think>


def _settled_llama3(text: str) -> str:
    head = text.lstrip()
    if not head or head.startswith("{") or head.startswith("<|python_tag|>") or "<|python_tag|>".startswith(head):
        return ""
    return text


def _settled_harmony(text: str) -> str:
    end = text.rfind("<|end|>")
    return text[:end + len("<|end|>")] if end >= 0 else ""


SETTLED: dict[str, Callable[[str], str]] = {
    "qwen3": _settled_qwen, "qwen3-coder": _settled_qwen, "llama3": _settled_llama3, "gpt-oss": _settled_harmony,
}


class FamilyStream:
    """Feed text deltas; get reasoning/content deltas that the final parse keeps."""

    def __init__(self, family: str, parse_text: Callable[[str], FamilyParse]) -> None:
        self._settled = SETTLED[family]
        self._parse = parse_text
        self._text = ""
        self._sent = {"reasoning": "", "content": ""}

    def feed(self, delta: str) -> list[TextEvent]:
        self._text += delta
        settled = self._settled(self._text)
        if not settled:
            return []
        parsed = self._parse(settled)
        if parsed.errors:  # a partial parse that fails says nothing certain yet
            return []
        return self._advance(parsed)

    def finish(self) -> list[TextEvent]:
        return self._advance(self._parse(self._text))

    def _advance(self, parsed: FamilyParse) -> list[TextEvent]:
        events: list[TextEvent] = []
        for kind, now in (("reasoning", parsed.reasoning or ""), ("content", parsed.content)):
            sent = self._sent[kind]
            if not now.startswith(sent):  # never expected: settled text parsed differently later
                continue
            if len(now) > len(sent):
                events.append((kind, now[len(sent):]))
                self._sent[kind] = now
        return events
