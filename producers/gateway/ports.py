"""What the gateway needs from the model's text side: render, tokenize, detokenize, parse.

``text_side.ModelTextSide`` implements it on the project's ChatRenderer and output parser; the call
service only sees this interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from producers.gateway.attempts import SampledOutput


@dataclass
class Rendered:
    prompt_ids: list[int]
    spliced_outputs: int = 0  # earlier outputs of the attempt that entered as their exact sampled ids
    prefix_breaks: list[str] = field(default_factory=list)  # where the template dropped/rewrote history


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # JSON text


@dataclass
class ParsedText:
    content: str
    reasoning: str | None
    tool_calls: list[ParsedToolCall]


class TextSide(Protocol):
    tokenizer_fingerprint: str
    chat_template_fingerprint: str
    parser_version: str
    vocab_size: int
    stop_token_ids: tuple[int, ...]

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                    prefix_mode: str, outputs: Sequence[SampledOutput],
                    template_kwargs: dict[str, Any]) -> Rendered:
        """Prompt ids ending in the generation prompt; ValueError for a conversation it cannot render."""
        ...

    def encode_text(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str:
        """Visible text of sampled ids (end-of-turn tokens dropped)."""
        ...

    def token_text(self, token_id: int) -> str: ...

    def parse(self, text: str) -> ParsedText: ...

    def stream_split(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) of a partial output that are safe to show: never retracted later."""
        ...
