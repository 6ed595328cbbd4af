"""Why a harness's call did not extend the previous call's prompt ‖ output: named causes for the table of
``tokentrail harnesses check``, read from the two requests' messages (as the gateway converts them) and the
text the previous call sampled. Pure: no gateway, no Kafka.

The causes (issue 18 item 8): ``compaction`` (earlier history dropped or rewritten), ``stripped thinking
block`` (the sampled reasoning is not sent back), ``injected reminder`` (a harness message resent after the
new turn or inserted into the history, e.g. OpenClaw's internal context), ``changed system prompt``, and
``re-serialized tool arguments`` (the harness sends back the tool call's arguments as other JSON text than the
model sampled; the template then renders other tokens).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

Message = Mapping[str, Any]

COMPACTION = "compaction"
STRIPPED_THINKING = "stripped thinking block"
INJECTED_REMINDER = "injected reminder"
CHANGED_SYSTEM = "changed system prompt"
RESERIALIZED_ARGUMENTS = "re-serialized tool arguments"


def _system(messages: Sequence[Message]) -> list[Any]:
    return [m.get("content") for m in messages if m.get("role") in ("system", "developer")][:1]


def _after_system(messages: Sequence[Message]) -> Sequence[Message]:
    return messages[1:] if messages and messages[0].get("role") in ("system", "developer") else messages


def _same(a: Message, b: Message) -> bool:
    """Equal as the model sees them: role, content, reasoning, tool names and arguments (ids, which the
    templates do not render, and cache marks, which the adapters drop, do not count)."""
    def calls(m: Message) -> list[tuple[Any, Any]]:
        return [((c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
                for c in m.get("tool_calls") or []]
    return (a.get("role") == b.get("role") and a.get("content") == b.get("content")
            and _reasoning(a) == _reasoning(b) and calls(a) == calls(b))


def _reasoning(m: Message) -> Any:
    return m.get("reasoning_content") or m.get("reasoning")


def _json(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return None


def break_causes(previous: Sequence[Message], sampled: Any, current: Sequence[Message]) -> list[str]:
    """The causes of a prefix break between a call with ``previous`` messages, whose output parsed to
    ``sampled`` (a ``producers.parsing.ParsedOutput``), and the next call with ``current`` messages. Empty
    when none of the named causes is seen (the caller reports the gateway's own break text then)."""
    causes: list[str] = []
    if _system(previous) != _system(current):
        causes.append(CHANGED_SYSTEM)
        previous, current = _after_system(previous), _after_system(current)  # the rest is compared apart
    shared = 0
    while shared < min(len(previous), len(current)) and _same(previous[shared], current[shared]):
        shared += 1
    left_behind = previous[shared:]  # earlier messages not where they were
    rest = current[shared:]
    for m in left_behind:
        if any(_same(m, later) for later in rest):
            causes.append(INJECTED_REMINDER)  # resent after the new turn
        else:
            causes.append(COMPACTION)  # dropped or rewritten
    answer = next((m for m in rest if m.get("role") == "assistant"), None)
    if answer is not None and sampled is not None:
        if sampled.reasoning and not _reasoning(answer) and sampled.reasoning not in str(answer.get("content")):
            causes.append(STRIPPED_THINKING)
        sent = [(c.get("function") or {}).get("arguments") for c in answer.get("tool_calls") or []]
        for made, back in zip(sampled.tool_calls, sent, strict=False):
            if made.arguments != back and _json(made.arguments) == _json(back):
                causes.append(RESERIALIZED_ARGUMENTS)
    if answer is not None and any(m.get("role") == "user" for m in rest[:rest.index(answer)]) and not left_behind:
        causes.append(INJECTED_REMINDER)  # a user message inserted before the sampled turn
    return sorted(set(causes))
