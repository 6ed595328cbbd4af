"""Render OpenAI-style chat messages to the exact prompt ids the engine runs.

Two modes:

* ``render``: the chat template applied to the messages, tokenized (what ``apply_chat_template`` gives).
* ``render_spliced``: the same text, but wherever the history repeats what this attempt's earlier calls
  sampled, the sampled ids are used instead of re-tokenized text. Re-tokenizing sampled text can give
  different ids (BPE merges across what were separate sampling steps), which breaks the token prefix
  between calls and misattributes tokens; splicing keeps ``prompt_{i+1}`` an extension of
  ``prompt_i ‖ output_i`` wherever the template renders the same text.

Splicing never changes the text: the spliced ids always decode to exactly what the template renders,
proven on every call. For byte-level decoders the proof is piecewise (see ``piecewise_decoding`` in
``producers/tokenizer_config.py``): earlier prompts' proven texts are passed in, and only the new text is
decoded (not even that where the tokenizer's configuration proves it comes back unchanged, see
``round_trip_rule`` there); otherwise the whole prompt is decoded and compared. Where the template renders
something other than what was sampled (it drops earlier reasoning, re-serialises arguments, ...), the
rendered text wins and the break is reported.

How spans are found, without knowing the template: (1) the longest earlier ``prompt ‖ output`` whose
decoded text is a prefix of the rendered text is reused whole (the usual case: the new prompt only
appends tool results or a user turn); (2) assistant messages after that prefix that equal an earlier
call's parsed output are located by rendering once more with each replaced by a unique sentinel: the
text between sentinels is template output that does not depend on those messages, so the real render
must consist of the same pieces with the messages' rendered bodies between them.

Beside this module: its inputs and outputs (``producers/rendered_prompt.py``), its caches
(``producers/render_caches.py``), the template variables a request may set (``producers/template_variables.py``),
the text matching of splicing (``producers/splice_text.py``) and the tokenizer facts it relies on
(``producers/tokenizer_config.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.reference.fingerprint import sha256_file, sha256_text
from producers.parsing import ParsedOutput, parse_output
from producers.render_caches import ByteLru, CacheBudgets, RenderMemo
from producers.rendered_prompt import Message, PrefixBreak, PriorCall, RenderedPrompt, RenderError, SplicedSpan
from producers.splice_text import (
    find_body_end,
    first_difference,
    latest_matched,
    match_messages,
    reasoning_of,
    short,
    snippet,
    split_on,
    unique_sentinels,
)
from producers.template_variables import PROVIDED_TEMPLATE_NAMES, check_template_kwargs, template_variables
from producers.token_cache import PrefixTokenCache
from producers.tokenizer_config import piecewise_decoding, round_trip_rule
from schemas.tokens import IDS_DTYPE, IdArray


@dataclass
class _Piece:
    """Either text to tokenize or ids to copy, in prompt order."""

    text: str
    ids: IdArray | None = None
    call_index: int | None = None
    kind: str = ""
    # The ids' UTF-8 bytes are exactly ``text``'s (so they decode to it next to any other such piece).
    exact: bool = False


class ChatRenderer:
    """The pinned tokenizer and chat template of a model directory."""

    def __init__(self, model_dir: Path, *, caches: CacheBudgets | None = None, fast_ascii: bool = True,
                 cache_tokens: int | None = None) -> None:
        """``caches``: the byte budgets of the token cache, the render memo and the output memo.
        ``cache_tokens=0`` (kept for callers that render without caches, such as the embedded engine)
        turns all three off."""
        caches = caches if caches is not None else CacheBudgets()
        if cache_tokens == 0:
            caches = CacheBudgets(0, 0, 0)
        from transformers import AutoTokenizer

        # A prompt's pieces are tokenized in one batch; spreading that small batch over threads costs
        # more CPU than it saves (measured: 1.5 vs 2.5 ms a call), and calls already run concurrently.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        template = self.tokenizer.chat_template
        if not isinstance(template, str) or not template:
            raise RuntimeError(f"{self.model_dir} has no chat template")
        self.chat_template: str = template
        self.tokenizer_fingerprint = sha256_file(self.model_dir / "tokenizer.json")
        self.chat_template_fingerprint = sha256_text(template)
        self._backend = self.tokenizer.backend_tokenizer
        self.eos_token_id = int(self.tokenizer.eos_token_id)
        self.stop_token_ids: tuple[int, ...] = (self.eos_token_id,)
        self.vocab_size = len(self.tokenizer)
        # An upper bound on the bytes one token stands for (the UTF-8 length of its longest vocabulary string,
        # which never undercounts: byte-level and SentencePiece markers take more bytes than they mean).
        self.max_token_bytes = max(len(token.encode()) for token in self.tokenizer.get_vocab())
        # Prompts are cut for reuse at the added tokens the template emits (turn markers and the like).
        anchors = [t.content for t in self.tokenizer.added_tokens_decoder.values() if t.content in template]
        self.token_cache = PrefixTokenCache(self._backend, anchors, max_bytes=caches.token_cache_bytes,
                                            fast_ascii=fast_ascii)
        config = json.loads(self._backend.to_str())
        self.piecewise = piecewise_decoding(config) and self._decodes_piecewise()
        # Which texts decode(encode(text)) gives back by construction, so new text needs no decoding.
        self.round_trip = round_trip_rule(config) if self.piecewise and self._added_tokens_round_trip() else None
        # The rollouts of a group send the same conversation; a template that reads the clock renders
        # differently each time, so it is never memoized.
        self._render_memo = RenderMemo(enabled="strftime_now" not in template, max_bytes=caches.render_memo_bytes)
        self.template_variables = template_variables(template)
        self._output_memo: ByteLru[bytes, tuple[str, str]] = ByteLru(caches.output_memo_bytes)

    def _decodes_piecewise(self) -> bool:
        """A last guard on ``piecewise``: awkward text (multi-byte characters cut across ids, added
        tokens, spaces) decodes piece by piece as it does whole."""
        sample = " a  b\n\t\u00e9\u4e2d\U0001f600" + "".join(self._added_texts()) + " end "
        a, b = self.encode(sample), self.encode(sample[::-1])
        return self.decode(a + b) == self.decode(a) + self.decode(b) == sample + sample[::-1]

    def _added_texts(self) -> list[str]:
        return [t.content for t in self.tokenizer.added_tokens_decoder.values()]

    def _added_tokens_round_trip(self) -> bool:
        """What ``round_trip_rule`` cannot read from the configuration: each added token decodes to its
        own text, nothing pads or truncates at run time, and an awkward sample comes back unchanged."""
        if self._backend.padding is not None or self._backend.truncation is not None:
            return False
        if any(self.decode([i]) != t.content for i, t in self.tokenizer.added_tokens_decoder.items()):
            return False
        sample = "".join(map(chr, range(1, 0x250))) + " \u4e2d\u6587 \U0001f600" + " x ".join(self._added_texts())
        return self.decode(self.encode(sample)) == sample

    def round_trips(self, text: str) -> bool:
        """``decode(encode(text)) == text`` without decoding: the tokenizer's ``round_trip`` rule covers
        the text, and it has no U+FFFD (so, as for spliced ids, its bytes are exactly the text's)."""
        rule = self.round_trip
        return (rule == "any" or (rule == "ascii" and text.isascii())) and "\ufffd" not in text

    # ------------------------------------------------------------------------------------ basics
    def encode(self, text: str) -> list[int]:
        """Plain tokenization, no special tokens added (special-token text still maps to its id)."""
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def encode_cached(self, text: str) -> list[int]:
        """Exactly ``encode(text)``, tokenizing only what follows the longest prefix this process
        tokenized before (see producers/token_cache.py)."""
        return self.token_cache.encode(text).tolist()

    def decode(self, ids: Sequence[int]) -> str:
        """Exact inverse of ``encode`` for valid UTF-8 (special tokens kept, no clean-up)."""
        return str(self._backend.decode(_int_list(ids), skip_special_tokens=False))

    def output_text(self, output_ids: Sequence[int]) -> str:
        """The text of a sampled output without its final stop token (what clients see)."""
        ids = _int_list(output_ids)
        if ids and ids[-1] in self.stop_token_ids:
            ids.pop()
        return self.decode(ids)

    def output_texts(self, output_ids: Sequence[int] | IdArray) -> tuple[str, str]:
        """(``decode(output_ids)``, ``output_text(output_ids)``), memoized: every later call of an
        attempt looks at all its earlier outputs."""
        key = hashlib.blake2b(_ids(output_ids).tobytes(), digest_size=16).digest()
        found = self._output_memo.get(key)
        if found is None:
            found = (self.decode(output_ids), self.output_text(output_ids))
            self._output_memo.put(key, found, sys.getsizeof(found[0]) + sys.getsizeof(found[1]))
        return found

    def cache_memory(self) -> dict[str, dict[str, int]]:
        """Bytes each cache holds against its budget, and its entries (for /health)."""
        tokens = self.token_cache.stats()
        return {"token_cache": {"bytes": tokens.bytes_held, "max_bytes": self.token_cache.max_bytes,
                                "entries": tokens.entries, "tokens": tokens.tokens_held},
                "render_memo": self._render_memo.memory(), "output_memo": self._output_memo.memory()}

    def parse(self, output_ids: Sequence[int]) -> ParsedOutput:
        return parse_output(self.output_text(output_ids))

    def template_kwargs(self, requested: Mapping[str, Any] | None) -> dict[str, Any]:
        """The extra template variables of a request (``chat_template_kwargs``) that the template reads.

        Others cannot change the text and are dropped (as vLLM drops them); names the renderer sets
        itself (messages, tools, add_generation_prompt, ...) are refused rather than silently lost."""
        if not requested:
            return {}
        check_template_kwargs(requested)
        known = self.template_variables
        return {k: v for k, v in requested.items()
                if (k in known if known is not None else k not in PROVIDED_TEMPLATE_NAMES)}

    def render_text(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None,
                    add_generation_prompt: bool = True, template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The template applied to the messages (``apply_chat_template(..., tokenize=False)``), with the
        request's ``template_kwargs`` (see ``template_kwargs``) as extra variables."""
        _check_messages(messages)
        kwargs = self.template_kwargs(template_kwargs)
        key = self._render_memo.key(messages, tools, add_generation_prompt, kwargs)
        text = self._render_memo.get(key)
        if text is not None:
            return text
        try:
            text = str(self.tokenizer.apply_chat_template(
                list(messages), tools=list(tools) if tools else None, tokenize=False,
                add_generation_prompt=add_generation_prompt, **kwargs,
            ))
        except Exception as exc:  # jinja errors, missing keys: the request is malformed
            raise RenderError(f"cannot render the messages with the chat template: {exc}") from exc
        self._render_memo.put(key, text)
        return text

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True, template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """``apply_chat_template(..., tokenize=True)``: the re-tokenized prompt."""
        _check_messages(messages)
        kwargs = self.template_kwargs(template_kwargs)
        try:
            ids = self.tokenizer.apply_chat_template(
                list(messages), tools=list(tools) if tools else None, tokenize=True, return_dict=False,
                add_generation_prompt=add_generation_prompt, **kwargs,
            )
        except Exception as exc:
            raise RenderError(f"cannot render the messages with the chat template: {exc}") from exc
        return [int(i) for i in ids]

    def render_cached(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None,
                      add_generation_prompt: bool = True, template_kwargs: Mapping[str, Any] | None = None) -> array:
        """Exactly ``render`` (as an ``array('I')``): the template's text, tokenized through the prefix
        cache."""
        return self.token_cache.encode(self.render_text(messages, tools, add_generation_prompt, template_kwargs))

    # ------------------------------------------------------------------------------------ splice
    def render_spliced(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None,
                       prior_calls: Sequence[PriorCall],
                       template_kwargs: Mapping[str, Any] | None = None) -> RenderedPrompt:
        """Render with the exact sampled ids of earlier calls wherever the template reproduces them."""
        _check_messages(messages)
        text = self.render_text(messages, tools, template_kwargs=template_kwargs)
        if not prior_calls:
            # Proven here when the rule covers the text: the attempt's next call then needs no decoding.
            return RenderedPrompt(_frozen(self.token_cache.encode(text)), text, text_is_exact=self.round_trips(text))
        outputs = {c.call_index: _OutputView(self, c) for c in prior_calls}
        matches = match_messages(messages, prior_calls, {i: view.message for i, view in outputs.items()})
        breaks: list[PrefixBreak] = []

        pieces: list[_Piece] = []
        covered = 0  # characters of ``text`` already covered by pieces
        base = self._longest_prefix_call(text, prior_calls, outputs)
        base_message = -1
        if base is not None:
            base_call, base_text, prompt_exact = base
            pieces.append(_Piece(base_text, _joined(base_call.prompt_ids, base_call.output_ids),
                                 base_call.call_index, "prefix",
                                 exact=prompt_exact and outputs[base_call.call_index].exact))
            covered = len(base_text)
            base_message = max((k for k, c in matches.items() if c == base[0].call_index), default=-1)
        latest = latest_matched(matches)
        if latest is None and base is None:
            # Nothing of this attempt recurs (a side conversation, or a history the harness rewrote).
            latest = (-1, prior_calls[-1].call_index)
        if latest is not None and (base is None or latest[1] != base[0].call_index):
            breaks.append(self._prefix_break(text, prior_calls, latest, outputs, messages))

        pending = {k: c for k, c in matches.items() if k > base_message}
        if pending:
            located, located_breaks = self._locate_outputs(messages, tools, text, pending, outputs, covered,
                                                           template_kwargs)
            breaks.extend(located_breaks)
            for start, call_index in located:
                view = outputs[call_index]
                pieces.append(_Piece(text[covered:start]))
                pieces.append(_Piece(view.text, _ids(view.call.output_ids), call_index, "output",
                                     exact=view.exact))
                covered = start + len(view.text)
        pieces.append(_Piece(text[covered:]))
        return self._assemble(text, pieces, breaks, base[0].call_index if base else None)

    def _longest_prefix_call(self, text: str, prior_calls: Sequence[PriorCall],
                             outputs: Mapping[int, _OutputView]) -> tuple[PriorCall, str, bool] | None:
        """The earlier call with the longest ``prompt ‖ output`` whose text starts ``text``, its text,
        and whether its prompt's bytes are exactly that text's (see ``piecewise_decoding``). Candidates
        are tried longest (in tokens) first; an earlier prompt is decoded only if its text is unknown."""
        ordered = sorted(prior_calls, key=lambda c: (len(c.prompt_ids) + len(c.output_ids), c.call_index),
                         reverse=True)
        for call in ordered:
            if not len(call.prompt_ids):
                continue
            known = call.prompt_text is not None
            prompt_text = call.prompt_text if known else self.decode(call.prompt_ids)
            chain_text = prompt_text + outputs[call.call_index].text
            if text.startswith(chain_text):
                return call, chain_text, self.piecewise and (known or "\ufffd" not in prompt_text)
        return None

    def _prefix_break(self, text: str, prior_calls: Sequence[PriorCall], latest: tuple[int, int],
                      outputs: Mapping[int, _OutputView], messages: Sequence[Message]) -> PrefixBreak:
        """Explain why the call whose output is the last assistant message is not this prompt's base."""
        message_index, call_index = latest
        call = next(c for c in prior_calls if c.call_index == call_index)
        chain_text = self._prompt_text(call) + outputs[call_index].text
        at = first_difference(chain_text, text)
        sampled = outputs[call_index].message
        dropped = [
            k for k, m in enumerate(messages)
            if m.get("role") == "assistant" and reasoning_of(m) and reasoning_of(m) not in text
        ]
        if message_index >= 0 and sampled.get("reasoning_content") and reasoning_of(sampled) not in text:
            dropped.append(message_index)
        reason = (
            f"prompt ‖ output is not a prefix of this prompt; texts differ from character {at}: "
            f"earlier {snippet(chain_text, at)} vs now {snippet(text, at)}"
        )
        if dropped:
            reason += f"; the template dropped the reasoning of assistant message(s) {sorted(set(dropped))}"
        if message_index < 0:
            reason += "; no assistant message in the history equals an output of this attempt"
        return PrefixBreak(call_index, message_index if message_index >= 0 else None, reason)

    def _locate_outputs(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None,
                        text: str, pending: Mapping[int, int], outputs: Mapping[int, _OutputView],
                        covered: int, template_kwargs: Mapping[str, Any] | None,
                        ) -> tuple[list[tuple[int, int]], list[PrefixBreak]]:
        """Find where each pending assistant message's body is in ``text``; splice it when it is exactly
        the sampled output."""
        sentinels = unique_sentinels(text, len(messages))
        masked = [
            {"role": "assistant", "content": sentinels[k]} if k in pending else m
            for k, m in enumerate(messages)
        ]
        order = sorted(pending)
        try:
            skeleton = self.render_text(masked, tools, template_kwargs=template_kwargs)
        except RenderError as exc:  # e.g. a template that needs the tool call before a tool message
            reason = f"the template cannot render the history with these messages masked ({exc}); no splice"
            return [], [PrefixBreak(None, order[0], reason)]
        fixed = split_on(skeleton, [sentinels[k] for k in order])
        if fixed is None or not text.startswith(fixed[0]):
            reason = "the template renders other messages differently when these change; no splice"
            return [], [PrefixBreak(None, order[0], reason)]
        located: list[tuple[int, int]] = []
        breaks: list[PrefixBreak] = []
        pos = len(fixed[0])
        for n, k in enumerate(order):
            after = fixed[n + 1]
            view = outputs[pending[k]]
            body_end = find_body_end(text, pos, after, is_last=n == len(order) - 1)
            if body_end is None:
                breaks.append(PrefixBreak(pending[k], k, "cannot locate the rendered message; no splice"))
                return located, breaks
            body = text[pos:body_end]
            if body == view.body and text.startswith(view.text, pos) and pos >= covered:
                located.append((pos, pending[k]))
            elif pos >= covered:
                reason = f"the template renders {short(body)} where the call sampled {short(view.body)}"
                if view.message.get("reasoning_content") and view.message["reasoning_content"] not in body:
                    reason += " (its reasoning is dropped)"
                breaks.append(PrefixBreak(pending[k], k, reason))
            pos = body_end + len(after)
        return located, breaks

    def _prompt_text(self, call: PriorCall) -> str:
        return call.prompt_text if call.prompt_text is not None else self.decode(call.prompt_ids)

    def _assemble(self, text: str, pieces: Sequence[_Piece], breaks: list[PrefixBreak],
                  base_call: int | None) -> RenderedPrompt:
        parts: list[IdArray] = []
        spans: list[SplicedSpan] = []
        length = 0
        proven = self.piecewise  # every piece's bytes are its text's: then so are the whole prompt's
        for piece in pieces:
            if piece.ids is None:
                if piece.text:
                    parts.append(_ids(self.token_cache.encode(piece.text)))
                    length += len(parts[-1])
                    # Only the new text is decoded, and only where no rule proves it comes back unchanged
                    # (normalizers, prefix spaces, stripping added tokens may change text).
                    proven = proven and "\ufffd" not in piece.text and (
                        self.round_trips(piece.text) or self.decode(parts[-1]) == piece.text)
                continue
            parts.append(piece.ids)
            assert piece.call_index is not None
            spans.append(SplicedSpan(piece.call_index, length, length + len(piece.ids), piece.kind))
            length += len(piece.ids)
            proven = proven and piece.exact
        ids = _frozen(np.concatenate(parts) if parts else np.zeros(0, IDS_DTYPE))
        if proven:
            return RenderedPrompt(ids, text, tuple(spans), tuple(breaks), base_call, text_is_exact=True)
        # Not provable piecewise (a sampled output ending inside a character, a tokenizer that is not
        # byte-level, an earlier prompt of unknown text): decode the whole prompt and compare.
        if self.decode(ids) != text:  # never expected; the text is the contract, so fall back to it
            breaks.append(PrefixBreak(None, None, "spliced ids did not decode to the rendered text"))
            return RenderedPrompt(_frozen(self.token_cache.encode(text)), text, (), tuple(breaks), None)
        exact = "\ufffd" not in text if self.piecewise else True
        return RenderedPrompt(ids, text, tuple(spans), tuple(breaks), base_call, text_is_exact=exact)


# ---------------------------------------------------------------------------------------- helpers
class _OutputView:
    """An earlier call's output as text: ``text`` decodes all its ids, ``body`` without the stop, and
    ``message`` is the assistant message it became. ``exact``: the ids' bytes are exactly ``text``'s
    (piecewise decoding, and no replacement character, so not cut inside a character)."""

    def __init__(self, renderer: ChatRenderer, call: PriorCall) -> None:
        self.call = call
        self.text, self.body = renderer.output_texts(call.output_ids)
        self.exact = renderer.piecewise and "\ufffd" not in self.text
        parsed = call.message if call.message is not None else renderer.parse(call.output_ids).to_message()
        self.message: Message = parsed


def _ids(values: Sequence[int] | array | IdArray) -> IdArray:
    if isinstance(values, np.ndarray):
        return values.astype(IDS_DTYPE, copy=False)
    if isinstance(values, array) and values.itemsize == 4:
        return np.frombuffer(values, dtype=np.uintc).astype(IDS_DTYPE, copy=False)
    return np.asarray(values, dtype=IDS_DTYPE)


def _joined(prompt: Sequence[int] | IdArray, output: Sequence[int] | IdArray) -> IdArray:
    return np.concatenate([_ids(prompt), _ids(output)])


def _int_list(ids: Sequence[int] | IdArray) -> list[int]:
    return ids.tolist() if isinstance(ids, np.ndarray | array) else list(ids)


def _frozen(values: Sequence[int] | array | IdArray) -> IdArray:
    arr = _ids(values)
    arr.flags.writeable = False
    return arr


def _check_messages(messages: Sequence[Message]) -> None:
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise RenderError("messages must be a list")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise RenderError(f"messages[{index}] must be an object with a string role")
