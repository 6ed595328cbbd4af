"""Drive one upstream generation: collect sampled ids and logprobs, detokenize incrementally, honour
stop strings, report text as it grows, and time the call.

Stop strings are the gateway's job (the Upstream interface stops on token ids only): generation is
cut at the token that completes a stop string; that token stays in the record (it was sampled and
conditioned nothing after it), and the text returned to the harness ends before the stop string.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from producers.upstreams.base import GenerateResult, TokenChunk
from schemas.tokens import TokenIds

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDecoder:
    """Text of a growing id sequence, decoding only a small window per step.

    A step's text is released only when the window decodes to more than before and does not end in
    an incomplete UTF-8 character (a byte-level token can carry part of one).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, new_ids: Sequence[int]) -> str:
        self.ids.extend(new_ids)
        before = self._decode(self.ids[self._prefix_offset:self._read_offset])
        after = self._decode(self.ids[self._prefix_offset:])
        if len(after) <= len(before) or after.endswith(REPLACEMENT_CHAR):
            return ""
        delta = after[len(before):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        self.text += delta
        return delta


@dataclass
class Generated:
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    text: str = ""  # visible text: up to (not including) a matched stop string
    finish_reason: str = "length"
    stop_string: str | None = None
    result: GenerateResult | None = None  # the upstream's final result (None when cut by the gateway)
    prompt_ids: TokenIds | None = None  # what the upstream reported running (pass-through relies on it)
    aborted: bool = False  # the harness went away before the end
    queue_ms: float = 0.0
    first_token_ms: float = 0.0
    total_ms: float = 0.0


TextSink = Callable[[str], Awaitable[None]]
PromptSink = Callable[[TokenIds], None]


async def run_generation(stream: AsyncIterator[TokenChunk | GenerateResult], *,
                         decode: Callable[[Sequence[int]], str], stop: Sequence[str] = (),
                         on_text: TextSink | None = None, on_prompt: PromptSink | None = None,
                         abort: asyncio.Event | None = None, began: float | None = None,
                         out: Generated | None = None) -> Generated:
    """Run one generation (an upstream's ``generate_stream`` or ``generate_chat_stream``) to its end,
    or to a stop string, or to ``abort``; raises UpstreamError.

    ``on_prompt`` hears the prompt ids an upstream reports having rendered (pass-through), before any
    text of that chunk. ``began`` (a perf_counter value, default now) is when the clock for first-token
    time started. ``out``, when given, is filled as items arrive, so that after a failure the caller
    still has the prompt and the ids sampled before it."""
    began = time.perf_counter() if began is None else began
    out = Generated() if out is None else out
    decoder = IncrementalDecoder(decode)
    longest_stop = max((len(s) for s in stop), default=0)
    # Text is needed while sampling only to find stop strings or to stream it; otherwise it is decoded
    # once at the end.
    live = bool(longest_stop) or on_text is not None
    if not live and abort is None:
        # Nobody reads tokens as they come: an upstream that can asks for the whole answer at once
        # (one response instead of an event per token).
        prefer_whole = getattr(stream, "prefer_whole", None)
        if prefer_whole is not None:
            prefer_whole()
    try:
        async for item in stream:
            if isinstance(item, GenerateResult):
                out.result = item
                break
            if not isinstance(item, TokenChunk):
                continue
            if item.prompt_ids is not None and out.prompt_ids is None:
                out.prompt_ids = item.prompt_ids
                if on_prompt is not None:
                    on_prompt(item.prompt_ids)
            if not item.ids:
                continue
            if not out.output_ids:
                out.first_token_ms = (time.perf_counter() - began) * 1000
            out.output_ids.extend(item.ids)
            out.output_logprobs.extend(item.logprobs)
            delta = decoder.push(item.ids) if live else ""
            if delta and longest_stop:
                window_start = max(0, len(decoder.text) - len(delta) - longest_stop + 1)
                hit = _first_stop(decoder.text, stop, window_start)
                if hit is not None:
                    position, matched = hit
                    out.text, out.stop_string, out.finish_reason = decoder.text[:position], matched, "stop"
                    break
            if delta and on_text is not None:
                await on_text(decoder.text)
            if abort is not None and abort.is_set():
                out.aborted = True
                break
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()  # a cut generation stops the upstream's work too
    out.total_ms = (time.perf_counter() - began) * 1000
    if out.result is not None:
        res = out.result
        if res.output_ids != out.output_ids:  # upstreams may deliver ids only in the final result
            out.output_ids, out.output_logprobs = list(res.output_ids), list(res.output_logprobs)
        out.finish_reason = res.finish_reason
        out.queue_ms = res.queue_ms
        if out.prompt_ids is None:
            out.prompt_ids = res.prompt_ids
            if on_prompt is not None:  # a whole answer reports its prompt only here
                on_prompt(res.prompt_ids)
    if out.stop_string is None:
        out.text = decode(out.output_ids)
    return out


def _first_stop(text: str, stop: Sequence[str], start: int) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for s in stop:
        if not s:
            continue
        pos = text.find(s, start)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, s)
    return best
