"""What the gateway needs from the model's text side: render, tokenize, detokenize, parse.

``text_side.ModelTextSide`` implements it on the project's ChatRenderer and output parser; the call
service only sees this interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from producers.gateway.attempt_state import PriorSample
from schemas.tokens import IDS_DTYPE, IdArray, TokenIds


@dataclass
class Rendered:
    # A read-only uint32 array from the text side; a list where the harness sent the ids itself.
    prompt_ids: TokenIds
    spliced_outputs: int = 0  # earlier outputs of the attempt that entered as their exact sampled ids
    prefix_breaks: list[str] = field(default_factory=list)  # where the template dropped/rewrote history
    # The text the prompt ids stand for, byte for byte, when the text side proved it; later calls of
    # the attempt reuse it instead of decoding this prompt again.
    text: str | None = None

    def array(self) -> IdArray:
        """``prompt_ids`` as a read-only uint32 array, converted at most once (the record, the delta
        base and the attempt state all need the array)."""
        if not isinstance(self.prompt_ids, np.ndarray) or self.prompt_ids.dtype != IDS_DTYPE:
            arr = np.asarray(self.prompt_ids, dtype=IDS_DTYPE)
            arr.flags.writeable = False
            self.prompt_ids = arr
        return self.prompt_ids


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # JSON text


@dataclass
class ParsedText:
    content: str
    reasoning: str | None
    tool_calls: list[ParsedToolCall]
    # Why tool-call markup in the output did not parse (the output is then answered as content, as the
    # family's reference server answers it); recorded with the call.
    errors: tuple[str, ...] = ()


TextEvent = tuple[Literal["reasoning", "content"], str]


class StreamParser(Protocol):
    def feed(self, delta: str) -> list[TextEvent]:
        """Reasoning/content deltas that are certain now (never retracted later)."""
        ...

    def finish(self) -> list[TextEvent]:
        """The remaining deltas once the whole output is known."""
        ...


class TextSide(Protocol):
    tokenizer_fingerprint: str
    chat_template_fingerprint: str
    parser_version: str
    vocab_size: int
    stop_token_ids: tuple[int, ...]

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                    prefix_mode: str, prior: Sequence[PriorSample],
                    template_kwargs: dict[str, Any] | None = None) -> Rendered:
        """Prompt ids ending in the generation prompt; ValueError for a conversation it cannot render.
        ``template_kwargs``: the request's extra template variables (``chat_template_kwargs``)."""
        ...

    def render_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    template_kwargs: dict[str, Any] | None = None) -> str: ...

    def encode_text(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str:
        """Visible text of sampled ids (stop tokens dropped)."""
        ...

    def token_text(self, token_id: int) -> str: ...

    def parse(self, text: str, template_kwargs: dict[str, Any] | None = None) -> ParsedText:
        """The output's content, reasoning and tool calls; ``template_kwargs`` as for ``render_chat`` (a family
        parses as its reference server does for the request, e.g. Qwen3 with ``enable_thinking``)."""
        ...

    def stream_parser(self, template_kwargs: dict[str, Any] | None = None) -> StreamParser: ...
