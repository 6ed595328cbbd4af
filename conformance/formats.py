"""Each family's output format: how its models write reasoning, text and tool calls, and who else parses it.

The writers produce what a model of the family samples after its generation prompt, the way the family's own
chat template renders an assistant turn (so a well-behaved model's output re-renders to itself), without the
final stop token (the engine adds it). The reference parsers are vLLM's names for the family
(``--tool-call-parser`` / ``--reasoning-parser``); the render judge is ``renderers``' name for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from conformance.corpus import Capabilities, Output


def _qwen3(out: Output) -> str:
    """Qwen3 (hermes tool calls): ``<think>`` block, text, then one ``<tool_call>`` JSON block per call. An answer
    with nothing to think still opens with an empty ``<think>`` block, as Qwen3 writes it in thinking mode: without
    it vLLM's ``qwen3`` parser (and the gateway, which parses as vLLM does) reads the whole answer as reasoning.
    A tool-call turn without reasoning is written bare (everything before ``<tool_call>`` is empty reasoning)."""
    empty = out.reasoning is None and not out.calls
    text = f"<think>\n{out.reasoning}\n</think>\n\n" if out.reasoning is not None else (
        "<think>\n\n</think>\n\n" if empty else "")
    body = out.content
    for k, call in enumerate(out.calls):
        body += "\n" if (k or body) else ""
        body += (f'<tool_call>\n{{"name": {json.dumps(call.name)}, "arguments": '
                 f"{json.dumps(call.arguments, ensure_ascii=False)}}}\n</tool_call>")
    return text + body


def _qwen3_coder(out: Output) -> str:
    """Qwen3-Coder (XML tool calls): text, then ``<tool_call><function=..><parameter=..>`` blocks; string
    values verbatim, others as JSON."""
    blocks = []
    for call in out.calls:
        params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n"
                         "</parameter>\n" for k, v in call.arguments.items())
        blocks.append(f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>")
    calls, content = "\n".join(blocks), out.content.strip()
    return f"{content}\n\n{calls}" if content and calls else content or calls


def _llama3(out: Output) -> str:
    """Llama 3.1+ (JSON tool calls): a tool call is the whole turn, ``{"name": .., "parameters": ..}``."""
    if out.calls:
        (call,) = out.calls  # the format has one call per turn
        return f'{{"name": {json.dumps(call.name)}, "parameters": {json.dumps(call.arguments, ensure_ascii=False)}}}'
    return out.content


def _gpt_oss(out: Output) -> str:
    """gpt-oss (harmony): an ``analysis`` message, then a ``commentary`` call to ``functions.NAME`` ending in
    ``<|call|>``, or a ``final`` message (its ``<|return|>`` is the engine's stop token)."""
    text = ""
    if out.reasoning is not None:
        text += f"<|channel|>analysis<|message|>{out.reasoning}<|end|><|start|>assistant"
    if out.calls:
        (call,) = out.calls  # one call per turn
        return (text + f"<|channel|>commentary to=functions.{call.name} <|constrain|>json<|message|>"
                f"{json.dumps(call.arguments, ensure_ascii=False)}<|call|>")
    return text + f"<|channel|>final<|message|>{out.content}"


@dataclass(frozen=True)
class FamilyFormat:
    family: str
    can: Capabilities
    write: Callable[[Output], str]
    vllm_tool_parser: str
    vllm_reasoning_parser: str | None
    harmony: bool = False
    renderer: str | None = None  # renderers' name; None: renderers has no renderer of this family
    # vLLM's chat render judges the prompt ids too (``vllm_render.py``): where renderers has no renderer, so the
    # gateway's own render is never the only one
    vllm_render: bool = False


FORMATS: dict[str, FamilyFormat] = {
    "qwen3": FamilyFormat("qwen3", Capabilities(), _qwen3, "hermes", "qwen3", renderer="qwen3"),
    # Qwen3-Coder is a non-thinking model; its template has no reasoning.
    "qwen3-coder": FamilyFormat("qwen3-coder", Capabilities(reasoning=False), _qwen3_coder, "qwen3_xml", None,
                                  vllm_render=True),
    "llama3": FamilyFormat("llama3", Capabilities(reasoning=False, parallel_calls=False, content_with_calls=False),
                           _llama3, "llama3_json", None, renderer="llama-3"),
    "gpt-oss": FamilyFormat("gpt-oss", Capabilities(parallel_calls=False, content_with_calls=False), _gpt_oss,
                            "openai", "openai_gptoss", harmony=True, renderer="gpt-oss"),
}
