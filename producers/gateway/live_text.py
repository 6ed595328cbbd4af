"""A streamed call's text as protocol frames: reasoning and content, never retracted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from producers.gateway.chat import CallOutcome
from producers.gateway.ports import TextEvent, TextSide


class LiveText:
    """Turns the growing output text into reasoning/content frames that are never retracted.

    Text that could still be the start of a stop string is held back; the parser holds back what
    could still change meaning (partial markers, open tool-call blocks).
    """

    def __init__(self, text: TextSide, fmt: Any, emit: Callable[[bytes], None], *, holdback: int,
                 raw_text: bool, template_kwargs: dict[str, Any] | None = None) -> None:
        self.fmt, self.emit = fmt, emit
        self.holdback, self.raw_text = holdback, raw_text
        self.parser = None if raw_text else text.stream_parser(template_kwargs)
        self.fed = 0  # characters of the output text given to the parser (or sent, for raw text)

    async def update(self, full_text: str) -> None:
        safe = len(full_text) - self.holdback
        if safe > self.fed:
            for frame in self._feed(full_text[self.fed:safe]):
                self.emit(frame)

    def _feed(self, delta: str) -> list[bytes]:
        self.fed += len(delta)
        if self.parser is None:
            return self.fmt.content(delta)
        return self._frames(self.parser.feed(delta))

    def _frames(self, events: list[TextEvent]) -> list[bytes]:
        frames: list[bytes] = []
        for kind, text in events:
            frames += self.fmt.reasoning(text) if kind == "reasoning" else self.fmt.content(text)
        return frames

    def finish(self, outcome: CallOutcome) -> list[bytes]:
        """The rest of the text (the outcome's text is final: cut at a stop string if one matched)."""
        frames = self._feed(outcome.text[self.fed:]) if len(outcome.text) > self.fed else []
        if self.parser is not None:
            frames += self._frames(self.parser.finish())
        return frames
