"""The gateway's text side for a model family (``models/families``): the family's real tokenizer and chat
template through the same ChatRenderer (transformers' ``apply_chat_template``, splice, prefix breaks) as
the reference model, with the messages prepared as vLLM prepares them, and the output parsed by the
family's library (``producers.families.formats``) instead of the hermes parser.

``text_side_for(model_dir)`` picks this text side when the directory's manifest names a family.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.reference.fingerprint import read_manifest, sha256_text
from producers.families.breaks import family_break_causes
from producers.families.formats import FamilyParse, OutputFormat, output_format
from producers.families.harmony import HarmonyChat, Prior
from producers.families.messages import template_messages
from producers.families.stream import FamilyStream
from producers.gateway.attempt_state import PriorSample
from producers.gateway.ports import ParsedText, ParsedToolCall, Rendered, TextEvent
from producers.gateway.text_side import ModelTextSide
from producers.render_caches import CacheBudgets
from producers.rendering import ChatRenderer


class FamilyTextSide(ModelTextSide):
    def __init__(self, renderer: ChatRenderer, family: str) -> None:
        super().__init__(renderer)
        self.family = family
        self.format: OutputFormat = output_format(family, renderer.model_dir, renderer.tokenizer)
        # The record's parser version names the family and the library (and its version) that parsed.
        self.parser_version = self.format.version
        stops = read_generation_stops(renderer)
        if stops:
            self.stop_token_ids = stops
            self._stop = frozenset(stops)
            renderer.stop_token_ids = stops

    @classmethod
    def from_dir(cls, model_dir: Path | str, *, fast_ascii: bool = True, caches: CacheBudgets | None = None,
                 harmony_start_date: str = "") -> FamilyTextSide:
        """``harmony_start_date``: gpt-oss's system message date (see ``HarmonyTextSide``)."""
        manifest = read_manifest(Path(model_dir)) or {}
        family = manifest.get("family")
        if not isinstance(family, str):
            raise ValueError(f"{model_dir} is not a family model (no family in its manifest)")
        renderer = ChatRenderer(Path(model_dir), fast_ascii=fast_ascii, caches=caches)
        if family == "gpt-oss":
            return HarmonyTextSide(renderer, family, start_date=harmony_start_date)
        return cls(renderer, family)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                    prefix_mode: str, prior: Sequence[PriorSample],
                    template_kwargs: dict[str, Any] | None = None) -> Rendered:
        rendered = super().render_chat(self._prepared(messages), tools, prefix_mode=prefix_mode, prior=prior,
                                       template_kwargs=template_kwargs)
        if rendered.prefix_breaks and prior:  # name the family format's causes on the record
            text = rendered.text if rendered.text is not None else self.renderer.decode(rendered.array())
            sampled = [(self.renderer.decode(p.output_ids), p.message) for p in prior]
            causes = family_break_causes(text, sampled)
            if causes:
                rendered.prefix_breaks.append(f"{self.family} format: {', '.join(causes)}")
        return rendered

    def render_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        return super().render_text(self._prepared(messages), tools, template_kwargs)

    def _prepared(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return template_messages(messages, thinking_key="thinking" in self.renderer.chat_template)

    def parse_family(self, text: str, *, thinking: bool = True) -> FamilyParse:
        """The family's parse of an output's text (without its stop token). The library parses ids: the
        text's ids are the sampled ones wherever the sample is canonical (scripted outputs always are)."""
        return self.format.parse(self.renderer.encode(text), thinking=thinking)

    def parse(self, text: str, template_kwargs: dict[str, Any] | None = None) -> ParsedText:
        parsed = self.parse_family(text, thinking=thinking_enabled(template_kwargs))
        return ParsedText(parsed.content, parsed.reasoning,
                          [ParsedToolCall(c.name, c.arguments) for c in parsed.tool_calls], parsed.errors)

    def stream_parser(self, template_kwargs: dict[str, Any] | None = None) -> FamilyStream:  # type: ignore[override]
        thinking = thinking_enabled(template_kwargs)
        return FamilyStream(self.family, lambda text: self.parse_family(text, thinking=thinking))


class HarmonyTextSide(FamilyTextSide):
    """gpt-oss: prompts rendered by ``openai_harmony`` as vLLM's chat path renders them, spliced at harmony's
    message boundaries (``producers.families.harmony``); the published Jinja template is not used (it differs
    from harmony after a tool result). The record's chat-template fingerprint names the harmony encoder."""

    def __init__(self, renderer: ChatRenderer, family: str, *, start_date: str = "") -> None:
        super().__init__(renderer, family)
        self.harmony = HarmonyChat(renderer.model_dir, start_date=start_date)
        self.chat_template_fingerprint = sha256_text(self.harmony.version)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                    prefix_mode: str, prior: Sequence[PriorSample],
                    template_kwargs: dict[str, Any] | None = None) -> Rendered:
        effort = _effort(template_kwargs)
        samples = [] if prefix_mode == "retokenize" else [Prior(p.call_index, p.output_ids, p.message, p.prompt_ids)
                                                          for p in prior]
        prompt = self.harmony.splice(messages, tools, samples, effort)
        return Rendered(prompt.ids, len(prompt.spliced), prompt.breaks)

    def render_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        return self.renderer.decode(self.harmony.render(messages, tools, _effort(template_kwargs)))


def _effort(template_kwargs: dict[str, Any] | None) -> str | None:
    """vLLM takes gpt-oss's reasoning effort from the request; here from ``chat_template_kwargs``."""
    effort = (template_kwargs or {}).get("reasoning_effort")
    return None if effort is None else str(effort)


def thinking_enabled(template_kwargs: dict[str, Any] | None) -> bool:
    """Whether the request left thinking on (``chat_template_kwargs.enable_thinking``, default on), as vLLM's
    Qwen3 parser reads it."""
    return (template_kwargs or {}).get("enable_thinking", True) is not False


def read_generation_stops(renderer: ChatRenderer) -> tuple[int, ...]:
    """Every id that ends a turn (generation_config's eos_token_id list), the tokenizer's EOS first."""
    import json

    path = renderer.model_dir / "generation_config.json"
    if not path.is_file():
        return ()
    eos = json.loads(path.read_text()).get("eos_token_id")
    ids = [int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None]
    first = [renderer.eos_token_id] if renderer.eos_token_id in ids else []
    return tuple(first + [i for i in ids if i not in first])


def text_side_for(model_dir: Path | str, *, fast_ascii: bool = True, caches: CacheBudgets | None = None,
                  harmony_start_date: str = "") -> ModelTextSide:
    """The family text side where the model directory holds a family, else the reference text side."""
    manifest = read_manifest(Path(model_dir)) or {}
    if isinstance(manifest.get("family"), str):
        return FamilyTextSide.from_dir(model_dir, fast_ascii=fast_ascii, caches=caches,
                                       harmony_start_date=harmony_start_date)
    return ModelTextSide.from_dir(model_dir, fast_ascii=fast_ascii, caches=caches)


_ = TextEvent  # the stream's events are ports.TextEvent tuples
