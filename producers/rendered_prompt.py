"""What the chat renderer takes and gives (``producers/rendering.py``): an earlier call of the attempt, the
rendered prompt with the spans it copied from earlier calls and the reasons it could not, and its client error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schemas.tokens import IdArray

Message = Mapping[str, Any]


@dataclass(frozen=True)
class PriorCall:
    """An earlier call of the same attempt: the ids the engine ran and sampled."""

    call_index: int
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    # The assistant message returned for it (OpenAI form). None: parsed here from the output ids.
    message: Message | None = None
    # What ``prompt_ids`` decode to, when known exactly (``RenderedPrompt.text`` of a prompt whose
    # ``text_is_exact``); None: decoded here. Saves decoding every earlier prompt on every call.
    prompt_text: str | None = None


@dataclass(frozen=True)
class SplicedSpan:
    """``prompt_ids[start:end]`` are ids copied unchanged from an earlier call."""

    call_index: int
    start: int
    end: int
    kind: str  # "prefix": that call's prompt ‖ output; "output": that call's output ids only


@dataclass(frozen=True)
class PrefixBreak:
    """Why this prompt does not reuse what an earlier call sampled."""

    call_index: int | None
    message_index: int | None
    reason: str

    def __str__(self) -> str:
        where = [f"call {self.call_index}"] if self.call_index is not None else []
        if self.message_index is not None:
            where.append(f"message {self.message_index}")
        return f"{', '.join(where) or 'prompt'}: {self.reason}"


@dataclass(frozen=True)
class RenderedPrompt:
    prompt_array: IdArray  # read-only
    text: str
    spliced: tuple[SplicedSpan, ...] = ()
    breaks: tuple[PrefixBreak, ...] = ()
    # The earlier call whose whole prompt ‖ output starts this prompt (None: no such call).
    base_call_index: int | None = None
    # The ids decode to ``text``, proven so that later prompts can build on it (with piecewise decoding:
    # their bytes are exactly the text's); a later call may pass ``text`` as ``PriorCall.prompt_text``.
    text_is_exact: bool = False

    @property
    def prompt_ids(self) -> list[int]:
        return self.prompt_array.tolist()

    @property
    def break_descriptions(self) -> list[str]:
        return [str(b) for b in self.breaks]


class RenderError(ValueError):
    """The messages cannot be rendered (bad shape, template error); a client error."""
