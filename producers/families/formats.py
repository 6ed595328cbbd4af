"""A family's output format: sampled text -> content, reasoning and tool calls, by a library.

- qwen3: ``renderers.Qwen3Renderer.parse_response`` (``<think>`` reasoning, hermes ``<tool_call>`` JSON).
- qwen3-coder: ``renderers``' ``DefaultRenderer`` with its ``qwen3.5`` tool parser (the XML
  ``<tool_call><function=..><parameter=..>`` calls Qwen3-Coder emits; Qwen3-Coder has no reasoning).
- llama3: ``renderers.Llama3Renderer.parse_response`` (JSON ``{"name", "parameters"}`` calls).
- gpt-oss: ``openai_harmony``'s ``StreamableParser`` over the sampled tokens; messages are mapped as
  vLLM's ``HarmonyParser`` maps them (analysis -> reasoning; final, or commentary to no one -> content;
  a ``functions.X`` recipient -> a tool call whose arguments are the message text).

A tool-call block the library cannot parse (broken JSON/XML, unclosed) is answered as vLLM's tool parsers
answer it (hermes, qwen3_coder, llama3_json: ``tools_called=False``, the whole text after the reasoning as
content, no tool calls), and the parse errors are kept so the record says what failed (kinds, positions and
sizes, never the output's text: the errors travel outside the sealed content fields, and the output itself is
on the record). Harmony output that
ends in a non-terminal state is answered as vLLM's ``HarmonyParser.flush`` answers it: the unfinished
message's raw text as final content.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class FamilyToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's function.arguments


@dataclass(frozen=True)
class FamilyParse:
    content: str
    reasoning: str | None
    tool_calls: tuple[FamilyToolCall, ...] = ()
    errors: tuple[str, ...] = field(default=())


class OutputFormat(Protocol):
    version: str  # recorded as the call's parser version

    def parse(self, output_ids: list[int], *, thinking: bool = True) -> FamilyParse:
        """Parse one sampled output (its ids, with or without the final stop token); ``thinking``: the request
        left thinking on (``enable_thinking``; only Qwen3 reads it)."""
        ...


def _arguments_text(arguments: Any) -> str:
    # As vLLM's parsers return them: json.dumps(..., ensure_ascii=False) of the parsed value.
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


class RenderersFormat:
    """A ``renderers`` renderer's ``parse_response`` on the family's tokenizer."""

    def __init__(self, tokenizer: Any, family: str, config: Any, parser_name: str, *,
                 accepted: frozenset[str] = frozenset({"ok"}), json_call_prefixes: tuple[str, ...] = (),
                 xml_string_values: bool = False, unclosed_is_reasoning: bool = False) -> None:
        """``accepted``: the parse statuses that are a good call (the XML format's values are text: a
        value that is not JSON is a string argument, status ``invalid_json``, not a failure).
        ``json_call_prefixes``: where the format has no call markers (llama3), an output that starts like
        a call but yields none is a parse failure. ``xml_string_values``: see ``framed_string_values``.
        ``unclosed_is_reasoning``: see ``_as_vllm_qwen3``."""
        from renderers import create_renderer

        self._renderer = create_renderer(tokenizer, config)
        self._accepted = accepted
        self._json_call_prefixes = json_call_prefixes
        self._xml_string_values = xml_string_values
        self._unclosed_is_reasoning = unclosed_is_reasoning
        self._tokenizer = tokenizer
        self.version = f"{family}: renderers=={version('renderers')} {parser_name}"

    def parse(self, output_ids: list[int], *, thinking: bool = True) -> FamilyParse:
        parsed = self._renderer.parse_response(list(output_ids))
        if self._unclosed_is_reasoning and thinking:
            text = self._text(output_ids)
            if "</think>" not in text:
                return self._as_vllm_qwen3(text, parsed)
        reasoning = parsed.reasoning_content
        if reasoning is not None and parsed.reasoning_complete is False:
            reasoning = reasoning.strip()  # as the complete block's is, so a stream's deltas add up to it
        reasoning = reasoning or None
        errors = tuple(f"tool call {k}: {c.status.value} ({len(c.raw)} characters)"
                       for k, c in enumerate(parsed.tool_calls) if c.status.value not in self._accepted)
        head = (parsed.content or "").lstrip()
        if not parsed.tool_calls and self._json_call_prefixes and head.startswith(self._json_call_prefixes):
            errors = (f"output starts like a tool call but none parsed ({len(head)} characters)",)
        if errors:  # vLLM: the parser gives up on the whole output; it all stays content
            return FamilyParse(self._content_after_reasoning(output_ids, parsed), reasoning, (), errors)
        calls = tuple(FamilyToolCall(str(c.name), _arguments_text(self._arguments(c))) for c in parsed.tool_calls)
        return FamilyParse(parsed.content or "", reasoning, calls)

    def _arguments(self, call: Any) -> Any:
        arguments = call.arguments if call.arguments is not None else {}
        if self._xml_string_values and isinstance(arguments, dict):
            return framed_string_values(call.raw or "", arguments)
        return arguments

    def _as_vllm_qwen3(self, text: str, parsed: Any) -> FamilyParse:
        """Qwen3 with thinking on and no ``</think>`` in the output: vLLM's ``qwen3`` reasoning parser starts in
        its reasoning state (the template's generation prompt opens the thought), so everything up to the first
        ``<tool_call>`` (which ends reasoning implicitly) is reasoning, none of it content; the tool calls
        after it are parsed as usual (renderers reads such an output as content instead)."""
        at = text.find("<tool_call>")
        head, tail = (text, "") if at < 0 else (text[:at], text[at:])
        reasoning = head.removeprefix("<think>").strip() or None
        errors = tuple(f"tool call {k}: {c.status.value} ({len(c.raw)} characters)"
                       for k, c in enumerate(parsed.tool_calls) if c.status.value not in self._accepted)
        if errors:  # the tool parser gives up on what follows the reasoning: it stays content
            return FamilyParse(tail, reasoning, (), errors)
        return FamilyParse("", reasoning, tuple(FamilyToolCall(str(c.name), _arguments_text(self._arguments(c)))
                                                for c in parsed.tool_calls))

    def _text(self, output_ids: list[int]) -> str:
        stops = set(self._renderer.get_stop_token_ids())
        ids = list(output_ids)
        while ids and ids[-1] in stops:
            ids.pop()
        return str(self._tokenizer.decode(ids, skip_special_tokens=False))

    def _content_after_reasoning(self, output_ids: list[int], parsed: Any) -> str:
        text = self._text(output_ids)
        end = "</think>"
        if parsed.reasoning_content is not None and end in text:
            text = text.split(end, 1)[1].lstrip("\n")
        return text


_XML_PARAMETER = re.compile(r"<parameter=([^>]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def framed_string_values(raw: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-Coder's template writes a parameter as ``<parameter=K>\nVALUE\n</parameter>``: one newline of
    framing on each side, the value verbatim. renderers' XML parser also strips the value's own surrounding
    whitespace (a file's trailing newline is lost); Qwen's reference parser and vLLM's ``qwen3_xml`` take
    exactly the framing off. So a value renderers kept as text is taken again from the raw block, framing
    only (its own pattern, without the strip); values it read as JSON stay as they are."""
    framed = {m.group(1): m.group(2) for m in _XML_PARAMETER.finditer(raw)}
    return {k: framed.get(k, v) if isinstance(v, str) else v for k, v in arguments.items()}


def renderers_format(family: str, tokenizer: Any) -> RenderersFormat:
    from renderers import DefaultRendererConfig, Llama3RendererConfig, Qwen3RendererConfig

    if family == "qwen3":
        return RenderersFormat(tokenizer, family, Qwen3RendererConfig(),
                               "parse_response(qwen3, no </think> is reasoning as vLLM)", unclosed_is_reasoning=True)
    if family == "qwen3-coder":
        return RenderersFormat(tokenizer, family, DefaultRendererConfig(tool_parser="qwen3.5"),
                               "parse_response(default, tool_parser=qwen3.5, framed string values)",
                               accepted=frozenset({"ok", "invalid_json"}), xml_string_values=True)
    if family == "llama3":
        return RenderersFormat(tokenizer, family, Llama3RendererConfig(), "parse_response(llama-3)",
                               json_call_prefixes=("{", "<|python_tag|>"))
    raise ValueError(f"no renderers output format for family {family!r}")


def use_local_harmony_vocab(model_dir: Path) -> None:
    """openai-harmony downloads o200k_base.tiktoken unless ``TIKTOKEN_ENCODINGS_BASE`` names a directory
    holding it (it checks the published sha256): point it at the model directory's copy."""
    if not (Path(model_dir) / "o200k_base.tiktoken").is_file():
        raise FileNotFoundError(f"{model_dir} has no o200k_base.tiktoken (built by `tokentrail model build "
                                f"--family gpt-oss`)")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(Path(model_dir).resolve())


class HarmonyFormat:
    """gpt-oss's harmony format through ``openai_harmony``."""

    def __init__(self, model_dir: Path, tokenizer: Any) -> None:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        use_local_harmony_vocab(model_dir)
        self._encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        self._tokenizer = tokenizer
        self._stops = frozenset(self._encoding.stop_tokens_for_assistant_actions())
        self.version = f"gpt-oss: openai-harmony=={version('openai-harmony')} StreamableParser"

    def parse(self, output_ids: list[int], *, thinking: bool = True) -> FamilyParse:
        from openai_harmony import HarmonyError, Role, StreamableParser

        parser = StreamableParser(self._encoding, Role.ASSISTANT)
        ids = [int(t) for t in output_ids]
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[FamilyToolCall] = []
        errors: list[str] = []
        done, start = 0, 0  # messages completed; where the unfinished message's tokens start
        try:
            for k, token in enumerate(ids):
                parser.process(token)
                if len(parser.messages) > done:
                    done, start = len(parser.messages), k + 1
            parser.process_eos()
        except HarmonyError as exc:
            errors.append(f"harmony: {exc}")
        failed = bool(errors)
        for message in parser.messages[:done] if failed else parser.messages:
            ignored = self._place(message, reasoning, content, calls)
            if ignored:  # vLLM ignores it too; the record says so rather than dropping it silently
                errors.append(ignored)
        for k, call in enumerate(calls):
            try:
                json.loads(call.arguments)
            except json.JSONDecodeError:  # kept as vLLM keeps it; the record says it is not JSON
                errors.append(f"tool call {k} ({call.name}): arguments are not JSON ({len(call.arguments)} characters)")
        if failed:  # vLLM's HarmonyParser.flush: the unfinished message's raw text as final content
            rest = ids[start:]
            while rest and rest[-1] in self._stops:
                rest.pop()
            content.append(self._tokenizer.decode(rest, skip_special_tokens=False))
        return FamilyParse("".join(content), "".join(reasoning) if reasoning else None, tuple(calls), tuple(errors))

    @staticmethod
    def _place(message: Any, reasoning: list[str], content: list[str], calls: list[FamilyToolCall]) -> str | None:
        """File a harmony message as vLLM's HarmonyParser does; the reason it is ignored, if it is."""
        text = "".join(getattr(c, "text", "") for c in message.content)
        recipient = message.recipient or None
        if recipient and recipient.startswith("functions."):
            calls.append(FamilyToolCall(recipient.removeprefix("functions."), text))
        elif message.channel == "analysis":
            reasoning.append(text)
        elif message.channel == "final" or (message.channel == "commentary" and recipient is None):
            content.append(text)
        else:
            return (f"harmony message ignored (channel {message.channel!r}, recipient {recipient!r}, "
                    f"{len(text)} characters)")
        return None


def output_format(family: str, model_dir: Path, tokenizer: Any) -> OutputFormat:
    if family == "gpt-oss":
        return HarmonyFormat(model_dir, tokenizer)
    return renderers_format(family, tokenizer)
