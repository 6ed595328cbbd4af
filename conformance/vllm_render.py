"""vLLM's own chat render as a judge of the gateway's prompt ids (issue 28, item 4a): pure verdicts.

The render runs in vLLM's environment (``vllm_render_worker.py``, in the same subprocess batch as vLLM's
parsers: ``vllm_parsers.py``): vLLM's GPU-less render path for ``/v1/chat/completions`` over the family's model
directory. It judges a family that ``renderers`` has no renderer of (Qwen3-Coder), where the only other
render would be the gateway's own (transformers over the same template), and adds a third implementation
where ``renderers`` judges too. The request is the one the harness sent where it spoke OpenAI chat or Anthropic
Messages (vLLM converts an Anthropic body with its own /v1/messages conversion), so vLLM's request preparation
(tools' ``strict``, Claude Code's billing header, text-block joins) is judged too; a Responses request is the
gateway's conversion of it.

A prompt agrees with vLLM's render when its ids are vLLM's ids ("render"), or, where the gateway spliced the
previous call's prompt ‖ sampled output (which a re-render may tokenize differently: that is what the splice
keeps), when it decodes to the text vLLM rendered and the tokens after the spliced context are vLLM's last
tokens ("bridge": the new turn tokenized as vLLM tokenizes it, after the sampled tokens kept as sampled).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.judge import RenderVerdict, _common

Message = dict[str, Any]


@dataclass(frozen=True)
class RenderJob:
    key: str
    model_dir: Path
    tool_parser: str | None
    messages: list[Message]  # OpenAI chat messages, as sent where the harness spoke OpenAI chat
    tools: list[dict[str, Any]] | None
    prompt_ids: Sequence[int]  # the gateway's, decoded by vLLM's tokenizer for the text comparison
    # An Anthropic Messages body as the harness sent it: vLLM converts it itself (its /v1/messages conversion)
    # and renders that; ``messages`` and ``tools`` are then unused
    anthropic: dict[str, Any] | None = None


@dataclass(frozen=True)
class VllmRender:
    prompt_ids: list[int] | None
    text: str | None  # vLLM's render, decoded with special tokens
    gateway_text: str | None  # the gateway's prompt ids decoded by vLLM's tokenizer
    error: str | None


def render_verdict(prompt: Sequence[int], previous: tuple[Sequence[int], Sequence[int]] | None,
                   theirs: VllmRender) -> RenderVerdict:
    """The gateway's prompt against vLLM's render of the same request."""
    if theirs.error or theirs.prompt_ids is None:
        return RenderVerdict(False, "refused", f"vLLM does not render the request: {theirs.error}"[:300])
    prompt, ids = list(prompt), theirs.prompt_ids
    if prompt == ids:
        return RenderVerdict(True, "render")
    context = list(previous[0]) + list(previous[1]) if previous is not None else []
    spliced = bool(context) and prompt[:len(context)] == context
    tail = prompt[len(context):]
    if spliced and theirs.gateway_text == theirs.text and len(tail) <= len(ids) and ids[len(ids) - len(tail):] == tail:
        return RenderVerdict(True, "bridge")
    at = _common(prompt, ids)
    same_text = "same text" if theirs.gateway_text == theirs.text else "different text"
    return RenderVerdict(False, "mismatch", f"vs vLLM's render ({same_text}{', spliced' if spliced else ''}): "
                                            f"first difference at token {at} of {len(prompt)}/{len(ids)}")
