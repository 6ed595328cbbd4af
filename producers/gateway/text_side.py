"""The model's text side for the gateway, on the project's ChatRenderer and hermes output parser."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from producers.gateway.attempt_state import PriorSample
from producers.gateway.ports import ParsedText, ParsedToolCall, Rendered, TextEvent
from producers.parsing import (
    PARSER_VERSION,
    ContentDelta,
    ReasoningDelta,
    StreamEvent,
    StreamingParser,
    parse_output,
)
from producers.render_caches import CacheBudgets
from producers.rendered_prompt import PriorCall, RenderError
from producers.rendering import ChatRenderer
from schemas.tokens import IDS_DTYPE, NO_IDS, IdArray


class ModelTextSide:
    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        self.tokenizer_fingerprint = renderer.tokenizer_fingerprint
        self.chat_template_fingerprint = renderer.chat_template_fingerprint
        self.parser_version = PARSER_VERSION
        self.vocab_size = renderer.vocab_size
        self.max_token_bytes = renderer.max_token_bytes
        self.stop_token_ids = tuple(renderer.stop_token_ids)
        self._stop = frozenset(self.stop_token_ids)

    @classmethod
    def from_dir(cls, model_dir: Path | str, *, fast_ascii: bool = True,
                 caches: CacheBudgets | None = None) -> ModelTextSide:
        return cls(ChatRenderer(Path(model_dir), fast_ascii=fast_ascii, caches=caches))

    def cache_memory(self) -> dict[str, dict[str, int]]:
        """Bytes the renderer's caches hold against their budgets (for /health)."""
        return self.renderer.cache_memory()

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                    prefix_mode: str, prior: Sequence[PriorSample],
                    template_kwargs: dict[str, Any] | None = None) -> Rendered:
        try:
            if prefix_mode == "retokenize":
                ids = self.renderer.render_cached(messages, tools, template_kwargs=template_kwargs)
                return Rendered(_read_only(ids))
            calls = [PriorCall(p.call_index, NO_IDS if p.prompt_ids is None else p.prompt_ids,
                               p.output_ids, p.message, p.prompt_text) for p in prior]
            rendered = self.renderer.render_spliced(messages, tools, calls, template_kwargs)
        except RenderError as exc:
            raise ValueError(str(exc)) from None
        return Rendered(rendered.prompt_array, len(rendered.spliced), rendered.break_descriptions,
                        text=rendered.text if rendered.text_is_exact else None)

    def render_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        try:
            return self.renderer.render_text(messages, tools, template_kwargs=template_kwargs)
        except RenderError as exc:
            raise ValueError(str(exc)) from None

    def encode_text(self, text: str) -> list[int]:
        return self.renderer.encode_cached(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.renderer.decode([i for i in ids if i not in self._stop])

    def token_text(self, token_id: int) -> str:
        return self.renderer.decode([token_id])

    def parse(self, text: str, template_kwargs: dict[str, Any] | None = None) -> ParsedText:
        parsed = parse_output(text)
        return ParsedText(parsed.content or "", parsed.reasoning,
                          [ParsedToolCall(c.name, c.arguments) for c in parsed.tool_calls], parsed.errors)

    def stream_parser(self, template_kwargs: dict[str, Any] | None = None) -> _HermesStream:
        return _HermesStream()


def _read_only(ids: array) -> IdArray:
    """A uint32 view of a fresh ``array('I')`` nobody else holds (no copy)."""
    arr = np.frombuffer(ids, dtype=np.uintc).astype(IDS_DTYPE, copy=False)
    arr.flags.writeable = False
    return arr


class _HermesStream:
    """Reasoning and content deltas from the streaming parser; tool calls are sent with the outcome."""

    def __init__(self) -> None:
        self._parser = StreamingParser()

    def feed(self, delta: str) -> list[TextEvent]:
        return _text_events(self._parser.feed(delta))

    def finish(self) -> list[TextEvent]:
        events, _ = self._parser.finish()
        return _text_events(events)


def _text_events(events: Sequence[StreamEvent]) -> list[TextEvent]:
    out: list[TextEvent] = []
    for event in events:
        if isinstance(event, ReasoningDelta):
            out.append(("reasoning", event.text))
        elif isinstance(event, ContentDelta):
            out.append(("content", event.text))
    return out
