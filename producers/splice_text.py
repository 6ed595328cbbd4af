"""The text side of splicing (``ChatRenderer.render_spliced``): which history messages are the outputs of earlier
calls, and where a message's rendered body lies in the prompt text, found with sentinel messages."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from producers.rendered_prompt import Message, PriorCall


def text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        return "".join(str(p.get("text", "")) for p in parts)
    return str(content)


def reasoning_of(message: Message) -> str:
    return str(message.get("reasoning_content") or message.get("reasoning") or "")


def message_key(message: Message) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What must agree for a history message to be the output of an earlier call: the content and the
    tool calls (name and arguments as JSON values). Ids and reasoning may be dropped by harnesses."""
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", call) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        calls.append((str(function.get("name", "")), json.dumps(arguments, sort_keys=True)))
    return text_of(message.get("content")), tuple(calls)


def match_messages(messages: Sequence[Message], prior_calls: Sequence[PriorCall],
                   sampled: Mapping[int, Message]) -> dict[int, int]:
    """Assistant message index -> the earlier call that produced it (latest unused call that matches,
    walking the history backwards so that repeated identical outputs pair up in order)."""
    by_key: dict[tuple[str, tuple[tuple[str, str], ...]], list[int]] = {}
    for call in prior_calls:
        by_key.setdefault(message_key(sampled[call.call_index]), []).append(call.call_index)
    matches: dict[int, int] = {}
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") != "assistant":
            continue
        candidates = by_key.get(message_key(message))
        if candidates:
            matches[index] = candidates.pop()
    return matches


def latest_matched(matches: Mapping[int, int]) -> tuple[int, int] | None:
    if not matches:
        return None
    index = max(matches)
    return index, matches[index]


def unique_sentinels(text: str, count: int) -> list[str]:
    salt = 0
    while True:
        candidates = [f"\u2063tt-splice-{salt}-{k}\u2063" for k in range(count)]
        if not any(s in text for s in candidates):
            return candidates
        salt += 1


def split_on(text: str, separators: Sequence[str]) -> list[str] | None:
    """``text`` split at each separator in order, or None if they do not occur exactly once each."""
    parts: list[str] = []
    rest = text
    for separator in separators:
        if rest.count(separator) != 1:
            return None
        before, rest = rest.split(separator)
        parts.append(before)
    parts.append(rest)
    return parts


def find_body_end(text: str, pos: int, after: str, is_last: bool) -> int | None:
    """Where the message body starting at ``pos`` ends: just before the template text that follows it.
    The last body is followed by the rest of the prompt, so it is located from the end."""
    if is_last:
        return len(text) - len(after) if text.endswith(after) and len(text) - len(after) >= pos else None
    found = text.find(after, pos)
    return None if found < 0 else found


def first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def snippet(text: str, at: int, width: int = 24) -> str:
    return repr(text[at:at + width])


def short(text: str, width: int = 60) -> str:
    return repr(text if len(text) <= width else text[: width - 3] + "...")
