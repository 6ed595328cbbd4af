"""The judges: what an implementation we did not write makes of the same request and the same output.

* Render (item 4a): the prompt ids the gateway recorded for a call must equal either ``renderers``' full
  render of the request (``render_ids``, its hand-written family renderer; harmony's own encoder inside it for
  gpt-oss) or, where the gateway kept the previous call's sampled ids, ``renderers``' own extension of the
  previous prompt ‖ output (``bridge_to_next_turn``). Anything else is a render mismatch, with where it starts.
* Parse (item 4b): the reasoning, text and tool calls the gateway parsed from an output must equal what vLLM's
  parser for the family extracts from the same text (normalized as ``normal_parse`` says).
* Drift (item 4c): where the gateway kept the previous call's prompt ‖ sampled output (spliced), the tokens of
  it that a plain re-render of the request would have lost or re-tokenized: the number splicing saves, per
  family. Where the prompt does not extend it (a named break), the tokens of it the prompt lost.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]


@dataclass(frozen=True)
class RenderVerdict:
    agrees: bool
    # "render" (a full render equals it), "bridge" (renderers' extension equals it), "variant" (they differ only
    # in a header form the family's format leaves open: the judges disagree among themselves, not a drift;
    # conformance/harmony_forms.py), "mismatch", or "refused" (renderers will not render the request: no judgement)
    how: str
    detail: str = ""


@dataclass
class Tally:
    """Per family (or per cell): what the judges found."""

    calls: int = 0
    render_agree_full: int = 0
    render_agree_bridge: int = 0
    render_mismatches: int = 0
    # Calls whose prompt differs from the judge's only in a header form the format leaves open (gpt-oss: where a
    # re-rendered tool call's recipient sits, its JSON content type spelled <|constrain|>json, json or not at all)
    render_format_variants: int = 0
    render_unjudged: int = 0  # no independent renderer of the family, or it refused the request
    # vLLM's chat render (vllm_render.py), where the family's format asks for it: calls it rendered, calls whose
    # prompt is its ids, calls whose prompt is its text with the spliced context kept as sampled, and the rest
    vllm_render_compared: int = 0
    vllm_render_agree_full: int = 0
    vllm_render_agree_bridge: int = 0
    vllm_render_mismatches: int = 0
    parse_compared: int = 0
    vllm_parse_mismatches: int = 0
    intended_mismatches: int = 0  # the gateway's parse differs from what the corpus scripted
    # Spliced calls: tokens of the previous prompt ‖ output a plain re-render would have lost or re-tokenized
    # (what the splice saved). Calls that did not extend the previous one: tokens their prompt lost (breaks).
    retokenize_drift_tokens: int = 0
    calls_with_drift: int = 0
    break_lost_tokens: int = 0
    details: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name, value in vars(other).items():
            if name == "details":
                self.details += value
            else:
                setattr(self, name, getattr(self, name) + value)

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "details"}


class IndependentRenderer:
    """``renderers``' renderer of a family over the family's own tokenizer (bring-your-own tokenizer)."""

    def __init__(self, renderer_name: str, tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> None:
        from renderers import create_renderer
        from renderers.configs import config_from_name

        self.name = renderer_name
        self.tokenizer = tokenizer
        self.renderer = create_renderer(tokenizer, config_from_name(renderer_name),
                                        chat_template_kwargs=dict(template_kwargs or {}))
        # renderers' gpt-oss generation prompt prefills the analysis channel (``<|start|>assistant<|channel|>
        # analysis<|message|>``); harmony's own completion prompt, the published template and vLLM end at
        # ``<|start|>assistant``. The prefill is renderers' choice, not the format's: it is taken off.
        self.prefill: list[int] = (list(tokenizer.encode("<|channel|>analysis<|message|>", add_special_tokens=False))
                                   if renderer_name == "gpt-oss" else [])

    def _unfilled(self, ids: Sequence[int]) -> list[int]:
        ids = list(ids)
        n = len(self.prefill)
        return ids[:-n] if n and ids[-n:] == self.prefill else ids

    def _prepared(self, messages: Sequence[Message]) -> list[Message]:
        if self.name != "gpt-oss":
            return _for_renderers(messages)
        # vLLM's harmony path takes tool-call arguments as sent (text, not an object), and renderers' gpt-oss
        # renderer reads a tool result's function from the message's ``name`` (its callers attach it), where
        # OpenAI chat names it by ``tool_call_id``: attach the name of the call it answers.
        return _named_tool_results(_for_renderers(messages, object_arguments=False))

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
        return self._unfilled(self.renderer.render_ids(self._prepared(messages), tools=_tools(tools),
                                                       add_generation_prompt=True))

    def bridge(self, prompt: Sequence[int], output: Sequence[int], messages: Sequence[Message],
               tools: Sequence[Mapping[str, Any]] | None) -> list[int] | None:
        prepared = self._prepared(messages)
        new = _after_last_assistant(prepared)
        if new is None:
            return None
        bridged = self.renderer.bridge_to_next_turn(list(prompt), list(output), new, tools=_tools(tools))
        return None if bridged is None else self._unfilled(bridged.token_ids)

    def refusal(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None) -> str | None:
        """Why renderers will not render the request (``judge`` says "refused"), None when it renders it."""
        try:
            self.render(messages, tools)
        except ValueError as exc:
            return str(exc)
        return None

    def judge(self, prompt: Sequence[int], messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None,
              previous: tuple[Sequence[int], Sequence[int]] | None) -> RenderVerdict:
        prompt = list(prompt)
        try:
            full = self.render(messages, tools)
        except ValueError as exc:  # renderers refuses the conversation (e.g. Llama 3 with two system messages)
            return RenderVerdict(False, "refused", f"renderers' {self.name} refuses the request: {exc}"[:300])
        if prompt == full:
            return RenderVerdict(True, "render")
        try:
            bridged = self.bridge(*previous, messages, tools) if previous is not None else None
        except ValueError:
            bridged = None
        if bridged is not None and prompt == bridged:
            return RenderVerdict(True, "bridge")
        closest = bridged if bridged is not None and _common(prompt, bridged) > _common(prompt, full) else full
        which = "bridge" if closest is bridged else "render"
        variant = self.header_variant(prompt, closest)
        if variant is not None:
            return RenderVerdict(False, "variant", f"vs renderers' {which}, only a header form harmony leaves open: "
                                                   f"{variant}"[:300])
        return RenderVerdict(False, "mismatch", f"vs renderers' {which}: {self.difference(prompt, closest)}")

    def header_variant(self, a: Sequence[int], b: Sequence[int]) -> str | None:
        """gpt-oss: what differs where two prompts differ only in harmony header forms (else None)."""
        if self.name != "gpt-oss":
            return None
        from conformance.harmony_forms import MESSAGE, START, header_variant

        ids = self.tokenizer.convert_tokens_to_ids([START, MESSAGE])
        return header_variant(a, b, start=ids[0], message=ids[1], decode=self.tokenizer.decode)

    def difference(self, a: Sequence[int], b: Sequence[int]) -> str:
        at = _common(a, b)
        return (f"first difference at token {at} of {len(a)}/{len(b)}: gateway "
                f"{self.tokenizer.decode(list(a[at:at + 12]))!r} vs {self.tokenizer.decode(list(b[at:at + 12]))!r}")


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _after_last_assistant(messages: Sequence[Message]) -> list[Message] | None:
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    return None if last is None else list(messages[last + 1:])


def _tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    return [dict(t) for t in tools] if tools else None


def _for_renderers(messages: Sequence[Message], *, object_arguments: bool = True) -> list[Message]:
    """OpenAI chat messages as a serving engine hands them to a renderer: ``content: null`` as empty text, and
    tool-call arguments (a JSON string on the wire) as the object they encode, as vLLM's
    ``/v1/chat/completions`` does before it renders (``_postprocess_messages``: the chat templates expect a
    mapping; text that is not a JSON object becomes ``{}``). Written here from vLLM's documented behaviour,
    not taken from the gateway, so the two preparations are compared too."""
    out = []
    for m in messages:
        message = {k: v for k, v in m.items() if v is not None or k == "content"}
        if message.get("content") is None:
            message["content"] = ""
        if object_arguments and message.get("role") == "assistant" and message.get("tool_calls"):
            message["tool_calls"] = [_object_arguments(c) for c in message["tool_calls"]]
        out.append(message)
    return out


def _named_tool_results(messages: list[Message]) -> list[Message]:
    names = {c.get("id"): (c.get("function") or {}).get("name") for m in messages for c in m.get("tool_calls") or ()}
    return [{**m, "name": names[m["tool_call_id"]]} if m.get("role") == "tool" and not m.get("name")
            and names.get(m.get("tool_call_id")) else m for m in messages]


def _object_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except ValueError:
            arguments = {}
    function["arguments"] = arguments if isinstance(arguments, dict) else {}
    return {**call, "function": function}


def drift_tokens(sent: Sequence[int], rerender: Sequence[int]) -> int:
    """Tokens in which a plain re-render differs from the prompt sent: the longer length less the tokens the
    two share in order (difflib's matching blocks, no junk heuristic)."""
    sent, rerender = list(sent), list(rerender)
    if sent == rerender:
        return 0
    matcher = difflib.SequenceMatcher(None, sent, rerender, autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    return max(len(sent), len(rerender)) - matched


def lost_tokens(context: Sequence[int], prompt: Sequence[int]) -> int:
    """Tokens of ``context`` (an earlier prompt ‖ the output sampled after it) that ``prompt`` does not keep
    in order: dropped or re-tokenized (difflib's matching blocks, no junk heuristic)."""
    context, prompt = list(context), list(prompt)
    if prompt[:len(context)] == context:
        return 0
    matcher = difflib.SequenceMatcher(None, context, prompt, autojunk=False)
    return len(context) - sum(block.size for block in matcher.get_matching_blocks())


def normal_parse(reasoning: str | None, content: str | None, tool_calls: Sequence[Mapping[str, Any]]) -> dict:
    """A parse as the judges compare it: reasoning and text stripped of surrounding whitespace (parsers differ
    on the newlines around ``<think>`` blocks, not on what the model said), tool calls as (name, arguments
    parsed as JSON; the text where it is not JSON)."""
    def args(value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value

    return {"reasoning": (reasoning or "").strip(), "content": (content or "").strip(),
            "tool_calls": [(c.get("name"), args(c.get("arguments"))) for c in tool_calls]}


def parse_difference(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> str:
    return "; ".join(f"{k}: {ours[k]!r} vs {theirs[k]!r}"[:300] for k in ("reasoning", "content", "tool_calls")
                     if ours[k] != theirs[k])
