"""gpt-oss prompts rendered with OpenAI's harmony encoder (``openai_harmony``), and spliced at harmony's
message boundaries.

The published gpt-oss Jinja template is not what serves gpt-oss: vLLM renders a chat request with harmony
(``vllm/entrypoints/openai/parser/harmony_utils.py``: ``parse_chat_inputs_to_harmony_messages`` and
``render_for_completion``), and the template differs from harmony after a tool result (it writes the tool's
recipient before the channel and re-serializes the result through ``tojson``). So the gateway renders gpt-oss
the way vLLM's chat path does, written here from reading vLLM's code (not imported: vLLM is another
environment):

- a leading system or developer message becomes the developer message's instructions; the system message is
  harmony's own (reasoning effort, knowledge cutoff, the conversation's start date);
- the request's tools become the developer message's ``functions`` namespace;
- an assistant turn with tool calls: its text as a ``commentary`` message, its reasoning as ``analysis``, each
  call as a ``commentary`` message to ``functions.NAME`` with content type ``json`` (arguments as sent);
  without tool calls: reasoning as ``analysis``, text as ``final``;
- a tool result: from ``functions.NAME`` (the name of the call it answers) to ``assistant`` on ``commentary``;
- analysis before the last ``final`` assistant message is dropped (harmony models expect it gone once a final
  answer follows).

Splicing: harmony renders message by message (``enc.render`` of each message concatenates to the conversation's
render), so the prompt is built from pieces and an assistant turn equal to what an earlier call of the attempt
sampled enters as the sampled ids themselves (after its ``<|start|>assistant`` header, which the earlier
prompt ended with), where the prompt built so far is exactly that call's prompt: the result is then that
call's prompt ‖ output extended, and otherwise (the harness rewrote what came before) the full render, never a
mix of the two that no other implementation would produce. A tool-call turn is kept whole, analysis
included, as harmony's format wants it during a tool cycle (the model writes the call's header as
``<|channel|>commentary to=functions.NAME <|constrain|>json``, which harmony 0.0.8 re-renders with the
recipient first). So ``prompt_{i+1}`` extends ``prompt_i ‖ output_i`` across tool round trips. Where the format
does not keep a sampled turn, the turn is rendered from the message and the break is named:
``reasoning_dropped`` (a later final answer drops its analysis) and ``turn_end_rewritten`` (a final answer's
``<|return|>`` is ``<|end|>`` once it is history).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

Message = Mapping[str, Any]

REASONING_DROPPED = "reasoning_dropped"
TURN_END_REWRITTEN = "turn_end_rewritten"
EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True)
class Prior:
    """An earlier call of the attempt: its sampled ids and the assistant message returned for them."""

    call_index: int
    output_ids: Sequence[int]
    message: Message | None
    prompt_ids: Sequence[int] | None = None  # None: no longer kept (then its turns are rendered, not spliced)


@dataclass
class HarmonyPrompt:
    ids: list[int]
    spliced: list[int] = field(default_factory=list)  # call indexes whose sampled ids are in the prompt
    starts: list[int] = field(default_factory=list)  # where each spliced turn starts (its header)
    breaks: list[str] = field(default_factory=list)


def _text(content: Any) -> str:
    """Text parts joined (as vLLM's ``flatten_input_text_content``); None as ""."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(p if isinstance(p, str) else str(p.get("text") or "")
                       for p in content if isinstance(p, str | Mapping))
    return str(content)


def _reasoning(message: Message) -> str:
    return _text(message.get("reasoning", message.get("reasoning_content")))


def _arguments(call: Mapping[str, Any]) -> tuple[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            return str(function.get("name", "")), json.loads(arguments)
        except json.JSONDecodeError:
            return str(function.get("name", "")), arguments
    return str(function.get("name", "")), arguments if arguments is not None else {}


def _same_turn(request: Message, sampled: Message) -> bool:
    """The harness sent back what the call sampled: the same tool calls (names, JSON-equal arguments) and text;
    reasoning equal where the harness sent it (many harnesses do not send it back)."""
    if [_arguments(c) for c in request.get("tool_calls") or ()] != \
            [_arguments(c) for c in sampled.get("tool_calls") or ()]:
        return False
    if _text(request.get("content")).strip() != _text(sampled.get("content")).strip():
        return False
    sent = _reasoning(request)
    return not sent or sent.strip() == _reasoning(sampled).strip()


class HarmonyChat:
    """Chat messages -> gpt-oss prompt ids, through ``openai_harmony`` (its vocabulary from the model directory)."""

    def __init__(self, model_dir: Path, *, start_date: str = "") -> None:
        """``start_date``: the system message's date (YYYY-MM-DD); "" is today's (UTC) at each render, as vLLM
        without ``VLLM_SYSTEM_START_DATE``."""
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        from producers.families.formats import use_local_harmony_vocab

        use_local_harmony_vocab(model_dir)
        self.encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        self.start_date = start_date
        special = {name: self.encoding.encode(name, allowed_special="all")[0]
                   for name in ("<|start|>", "<|end|>", "<|return|>", "<|call|>")}
        self._start, self._end, self._return, self._call = (special[k] for k in special)
        self._header = self.encoding.encode("<|start|>assistant", allowed_special="all")
        self.version = f"openai-harmony=={version('openai-harmony')} HARMONY_GPT_OSS (vLLM's chat conversion)"

    # ------------------------------------------------------------------ conversion (as vLLM's chat path)
    def _system(self, effort: str | None) -> Any:
        from openai_harmony import Message as HMessage
        from openai_harmony import ReasoningEffort, Role, SystemContent

        content = SystemContent.new()
        if effort is not None:
            if effort not in EFFORTS:
                raise ValueError(f"reasoning_effort {effort!r} is not one of {', '.join(EFFORTS)} (harmony)")
            content = content.with_reasoning_effort(ReasoningEffort(effort.capitalize()))
        date = self.start_date or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        return HMessage.from_role_and_content(Role.SYSTEM, content.with_conversation_start_date(date))

    def _developer(self, instructions: str | None, tools: Sequence[Mapping[str, Any]] | None) -> Any:
        from openai_harmony import DeveloperContent, Role, ToolDescription
        from openai_harmony import Message as HMessage

        content = DeveloperContent.new()
        if instructions is not None:
            content = content.with_instructions(instructions)
        functions = []
        for tool in tools or ():
            if tool.get("type", "function") != "function":
                raise ValueError(f"tool type {tool.get('type')!r} is not supported by gpt-oss's chat format")
            fn = tool.get("function") or tool
            functions.append(ToolDescription.new(name=str(fn.get("name", "")), description=fn.get("description") or "",
                                                 parameters=fn.get("parameters")))
        if functions:
            content = content.with_function_tools(functions)
        return HMessage.from_role_and_content(Role.DEVELOPER, content)

    def preamble(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None,
                 effort: str | None = None) -> tuple[list[Any], int]:
        """The system (and developer) messages, and how many request messages they consumed."""
        instructions, used = None, 0
        if messages and messages[0].get("role") in ("system", "developer"):
            instructions, used = _text(messages[0].get("content")), 1
        out = [self._system(effort)]
        if instructions or tools:
            out.append(self._developer(instructions or None, tools))
        return out, used

    def turn(self, message: Message, tool_names: Mapping[str, str]) -> list[Any]:
        """One request message as harmony messages."""
        from openai_harmony import Author, Role
        from openai_harmony import Message as HMessage

        role = message.get("role")
        if role == "assistant":
            out = []
            calls = message.get("tool_calls") or ()
            text, reasoning = _text(message.get("content")), _reasoning(message)
            if calls and text:
                out.append(HMessage.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary"))
            if reasoning:
                out.append(HMessage.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
            for call in calls:
                function = call.get("function") or {}
                arguments = function.get("arguments")
                arguments = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
                out.append(HMessage.from_role_and_content(Role.ASSISTANT, arguments).with_channel("commentary")
                           .with_recipient(f"functions.{function.get('name', '')}").with_content_type("json"))
            if not calls and text:
                out.append(HMessage.from_role_and_content(Role.ASSISTANT, text).with_channel("final"))
            return out
        if role == "tool":
            name = tool_names.get(str(message.get("tool_call_id", "")), "")
            return [HMessage.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"),
                                                     _text(message.get("content")))
                    .with_channel("commentary").with_recipient("assistant")]
        if role in ("system", "developer"):  # a later instruction message: a developer message of its own
            return [self._developer(_text(message.get("content")), None)]
        if role == "user":
            return [HMessage.from_role_and_content(Role.USER, _text(message.get("content")))]
        raise ValueError(f"gpt-oss's chat format has no role {role!r}")

    # ------------------------------------------------------------------ render and splice
    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None,
               effort: str | None = None) -> list[int]:
        """The prompt as vLLM's chat path renders it (no splicing)."""
        return self.splice(messages, tools, (), effort).ids

    def splice(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None,
               prior: Sequence[Prior], effort: str | None = None) -> HarmonyPrompt:
        """The prompt, with every assistant turn that is an earlier call's output (and that the format keeps as
        sampled) as that call's sampled ids, provided the prompt up to the last such turn is exactly that call's
        prompt (earlier prompts need not be kept: each was proven the same way when it was built); else the full
        render, and the break named."""
        out = self._build(messages, tools, prior, effort, splice=True)
        if out.spliced:
            last = max((p for p in prior if p.call_index == out.spliced[-1]), key=lambda p: p.call_index)
            start = out.starts[-1]
            if last.prompt_ids is None or [int(i) for i in last.prompt_ids] != out.ids[:start] + self._header:
                out = self._build(messages, tools, prior, effort, splice=False)
        return out

    def _build(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None,
               prior: Sequence[Prior], effort: str | None, *, splice: bool) -> HarmonyPrompt:
        head, used = self.preamble(messages, tools, effort)
        body = list(messages[used:])
        tool_names = {str(c.get("id")): str((c.get("function") or {}).get("name", ""))
                      for m in body for c in m.get("tool_calls") or ()}
        last_final = max((k for k, m in enumerate(body) if m.get("role") == "assistant"
                          and not m.get("tool_calls") and _text(m.get("content"))), default=-1)
        matched = self._matches(body, prior)
        out = HarmonyPrompt(list(self.encoding.render_conversation(_conversation(head))))
        causes: set[str] = set()
        for k, message in enumerate(body):
            sampled = matched.get(k)
            if sampled is not None:
                why = self._kept(sampled, after_final=k <= last_final)
                if why is not None:
                    out.breaks.append(f"call {sampled.call_index}, message {k + used}: harmony does not keep the "
                                      f"sampled turn ({', '.join(why)})")
                    causes.update(why)
                elif splice:
                    out.starts.append(len(out.ids))
                    out.ids += self._header + [int(i) for i in sampled.output_ids]
                    out.spliced.append(sampled.call_index)
                    continue
            for hm in self.turn(message, tool_names):
                if k <= last_final and hm.channel == "analysis":
                    continue  # vLLM's auto_drop_analysis_messages
                out.ids += self.encoding.render(hm)
        out.ids += self._header
        latest = max(prior, key=lambda p: p.call_index, default=None)
        if latest is not None and all(p.call_index != latest.call_index for p in matched.values()):
            out.breaks.append(f"call {latest.call_index}: no assistant message in the history equals its output "
                              "(the harness rewrote or dropped it)")
        elif latest is not None and latest.call_index not in out.spliced and not causes:
            kept = () if latest.prompt_ids is None else latest.prompt_ids  # the gateway's are numpy arrays
            before = [int(i) for i in kept] + [int(i) for i in latest.output_ids]
            at = next((n for n, (a, b) in enumerate(zip(before, out.ids, strict=False)) if a != b),
                      min(len(before), len(out.ids)))
            out.breaks.append(f"call {latest.call_index}: prompt ‖ output is not a prefix of this prompt; they "
                              f"differ from token {at} (the history before its turn changed)")
        if causes:  # the family format's causes, one entry (as FamilyTextSide names them; the drift views read it)
            out.breaks.append(f"gpt-oss format: {', '.join(sorted(causes))}")
        return out

    def _kept(self, sampled: Prior, *, after_final: bool) -> list[str] | None:
        """Why the format does not keep this sampled turn as sampled (None: it does)."""
        why = []
        if after_final and _reasoning(sampled.message or {}):  # a later final answer: harmony drops analysis
            why.append(REASONING_DROPPED)
        ids = list(sampled.output_ids)
        if not ids or ids[-1] != self._call:  # a final answer ends <|return|> as sampled, <|end|> as history
            why.append(TURN_END_REWRITTEN)
        return why or None

    @staticmethod
    def _matches(body: Sequence[Message], prior: Sequence[Prior]) -> dict[int, Prior]:
        """Assistant message index -> the earlier call it repeats: in history order, the first call after the
        previous match whose returned message the harness sent back."""
        out: dict[int, Prior] = {}
        calls = sorted((p for p in prior if p.message is not None and len(p.output_ids)), key=lambda p: p.call_index)
        after = -1
        for k, message in enumerate(body):
            if message.get("role") != "assistant":
                continue
            found = next((p for p in calls if p.call_index > after and _same_turn(message, p.message or {})), None)
            if found is not None:
                out[k], after = found, found.call_index
        return out


def _conversation(messages: list[Any]) -> Any:
    from openai_harmony import Conversation

    return Conversation.from_messages(messages)
