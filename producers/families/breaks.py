"""Name why a family's chat template does not reproduce what an earlier call sampled (the splice breaks
there), from the earlier outputs and the newly rendered prompt text. The names go on the record next to
the renderer's own break descriptions:

- ``reasoning_dropped``: an earlier output's reasoning is not in the prompt (Qwen3 renders reasoning only
  after the last user query; gpt-oss drops analysis once a final answer follows);
- ``tool_arguments_reserialized``: the sampled arguments text is gone but the template's re-serialization of
  the same JSON value is there (``tojson``);
- ``tool_call_rerendered``: the sampled tool-call markup is not in the prompt although the call is
  (the template writes it its own way: harmony's recipient before the channel, Qwen3-Coder's parameters);
- ``content_rewritten``: the sampled content is not in the prompt verbatim (e.g. trimmed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

REASONING_DROPPED = "reasoning_dropped"
TOOL_ARGUMENTS_RESERIALIZED = "tool_arguments_reserialized"
TOOL_CALL_RERENDERED = "tool_call_rerendered"
CONTENT_REWRITTEN = "content_rewritten"


def _reserialized(arguments: str) -> str | None:
    try:
        value = json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return None
    return json.dumps(value, ensure_ascii=False)


def _markup_rewritten(output_text: str, name: str, arguments: Any, prompt_text: str) -> bool:
    """The call is in the prompt (its name is) but the sampled markup from its name through its
    arguments is not."""
    start = output_text.find(name) if name else -1
    if start < 0 or name not in prompt_text:
        return False
    end = output_text.find(arguments, start) if isinstance(arguments, str) and arguments else -1
    window = output_text[start:end + len(arguments)] if end >= 0 else output_text[start:start + len(name)]
    return window not in prompt_text


def family_break_causes(prompt_text: str, sampled: Sequence[tuple[str, Mapping[str, Any] | None]]) -> list[str]:
    """Causes seen for the earlier outputs ``sampled`` ((output text, assistant message)) against the
    rendered ``prompt_text``; sorted, each once."""
    causes: set[str] = set()
    for output_text, message in sampled:
        if output_text in prompt_text or message is None:
            continue
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning and str(reasoning) not in prompt_text:
            causes.add(REASONING_DROPPED)
        content = message.get("content")
        if isinstance(content, str) and content.strip() and content not in prompt_text:
            causes.add(CONTENT_REWRITTEN)
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments not in prompt_text:
                again = _reserialized(arguments)
                if again is not None and again != arguments and again in prompt_text:
                    causes.add(TOOL_ARGUMENTS_RESERIALIZED)
            if _markup_rewritten(output_text, str(function.get("name", "")), arguments, prompt_text):
                causes.add(TOOL_CALL_RERENDERED)
    return sorted(causes)
