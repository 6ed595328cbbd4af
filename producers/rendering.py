"""Render OpenAI-style chat messages to the exact prompt ids the engine runs.

Two modes:

* ``render``: the chat template applied to the messages, tokenized (what ``apply_chat_template`` gives).
* ``render_spliced``: the same text, but wherever the history repeats what this attempt's earlier calls
  sampled, the sampled ids are used instead of re-tokenized text. Re-tokenizing sampled text can give
  different ids (BPE merges across what were separate sampling steps), which breaks the token prefix
  between calls and misattributes tokens; splicing keeps ``prompt_{i+1}`` an extension of
  ``prompt_i ‖ output_i`` wherever the template renders the same text.

Splicing never changes the text: the spliced ids always decode to exactly what the template renders,
proven on every call. For byte-level decoders the proof is piecewise (see ``piecewise_decoding``):
earlier prompts' proven texts are passed in, and only the new text is decoded (not even that where the
tokenizer's configuration proves it comes back unchanged, see ``round_trip_rule``); otherwise the whole
prompt is decoded and compared. Where the template renders something other than what was sampled (it drops
earlier reasoning, re-serialises arguments, ...), the rendered text wins and the break is reported.

How spans are found, without knowing the template: (1) the longest earlier ``prompt ‖ output`` whose
decoded text is a prefix of the rendered text is reused whole (the usual case: the new prompt only
appends tool results or a user turn); (2) assistant messages after that prefix that equal an earlier
call's parsed output are located by rendering once more with each replaced by a unique sentinel: the
text between sentinels is template output that does not depend on those messages, so the real render
must consist of the same pieces with the messages' rendered bodies between them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import orjson

from models.reference.fingerprint import sha256_file, sha256_text
from producers.parsing import ParsedOutput, parse_output
from producers.token_cache import PrefixTokenCache
from producers.tokenizer_config import adds_nothing, nfc_only, normalizer_steps
from schemas.tokens import IDS_DTYPE, IdArray

Message = Mapping[str, Any]
K = TypeVar("K")
V = TypeVar("V")


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


@dataclass
class _Piece:
    """Either text to tokenize or ids to copy, in prompt order."""

    text: str
    ids: IdArray | None = None
    call_index: int | None = None
    kind: str = ""
    # The ids' UTF-8 bytes are exactly ``text``'s (so they decode to it next to any other such piece).
    exact: bool = False


class RenderError(ValueError):
    """The messages cannot be rendered (bad shape, template error); a client error."""


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
                if (k in known if known is not None else k not in _PROVIDED_TEMPLATE_NAMES)}

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
        matches = _match_messages(messages, prior_calls, outputs)
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
        latest = _latest_matched(matches)
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
        at = _first_difference(chain_text, text)
        sampled = outputs[call_index].message
        dropped = [
            k for k, m in enumerate(messages)
            if m.get("role") == "assistant" and _reasoning_of(m) and _reasoning_of(m) not in text
        ]
        if message_index >= 0 and sampled.get("reasoning_content") and _reasoning_of(sampled) not in text:
            dropped.append(message_index)
        reason = (
            f"prompt ‖ output is not a prefix of this prompt; texts differ from character {at}: "
            f"earlier {_snippet(chain_text, at)} vs now {_snippet(text, at)}"
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
        sentinels = _sentinels(text, len(messages))
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
        fixed = _split_on(skeleton, [sentinels[k] for k in order])
        if fixed is None or not text.startswith(fixed[0]):
            reason = "the template renders other messages differently when these change; no splice"
            return [], [PrefixBreak(None, order[0], reason)]
        located: list[tuple[int, int]] = []
        breaks: list[PrefixBreak] = []
        pos = len(fixed[0])
        for n, k in enumerate(order):
            after = fixed[n + 1]
            view = outputs[pending[k]]
            body_end = _body_end(text, pos, after, is_last=n == len(order) - 1)
            if body_end is None:
                breaks.append(PrefixBreak(pending[k], k, "cannot locate the rendered message; no splice"))
                return located, breaks
            body = text[pos:body_end]
            if body == view.body and text.startswith(view.text, pos) and pos >= covered:
                located.append((pos, pending[k]))
            elif pos >= covered:
                reason = f"the template renders {_short(body)} where the call sampled {_short(view.body)}"
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
# Template variables the renderer itself sets (or that steer rendering): a request may not set them.
RESERVED_TEMPLATE_VARIABLES = frozenset({
    "messages", "tools", "add_generation_prompt", "continue_final_message", "documents", "chat_template",
    "tokenize", "return_dict", "return_assistant_tokens_mask", "conversation"})
# Names Jinja and transformers give every template; a request may not shadow them.
_PROVIDED_TEMPLATE_NAMES = frozenset({"range", "dict", "lipsum", "cycler", "joiner", "namespace",
                                      "raise_exception", "strftime_now"})


def check_template_kwargs(requested: Mapping[str, Any]) -> None:
    """Refuse (RenderError) template variables a request may not set: the renderer sets them itself."""
    reserved = sorted(set(requested) & RESERVED_TEMPLATE_VARIABLES)
    if reserved:
        raise RenderError(f"chat_template_kwargs may not set {', '.join(reserved)}: the gateway sets them itself")


def template_variables(template: str) -> frozenset[str] | None:
    """The variables ``template`` reads but does not set itself (a request may supply them), less the
    names Jinja and transformers provide (helpers such as ``raise_exception``, ``range``); None where the
    template uses syntax a plain Jinja parser does not know (e.g. transformers' ``{% generation %}``)."""
    import jinja2
    from jinja2 import meta

    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        names = meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateSyntaxError:
        return None
    return frozenset(names - _PROVIDED_TEMPLATE_NAMES - RESERVED_TEMPLATE_VARIABLES)


@dataclass(frozen=True)
class CacheBudgets:
    """Bytes each of the renderer's caches may hold (0: that cache is off). Every one is an LRU: over
    its budget the least recently used entries go; a single entry larger than the budget is not kept."""

    token_cache_bytes: int = 32 * 1024 * 1024
    render_memo_bytes: int = 16 * 1024 * 1024
    output_memo_bytes: int = 8 * 1024 * 1024


# What an LRU entry costs beside its value: the ordered dict's slot and node, the key object.
LRU_ENTRY_BYTES = 160


class ByteLru(Generic[K, V]):
    """A thread-safe LRU map bounded by the bytes its values hold (as the caller sizes them, plus
    ``LRU_ENTRY_BYTES`` an entry)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V, nbytes: int) -> None:
        size = nbytes + LRU_ENTRY_BYTES
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._bytes -= self._items.popitem(last=False)[1][1]

    def memory(self) -> dict[str, int]:
        with self._lock:
            return {"bytes": self._bytes, "max_bytes": self.max_bytes, "entries": len(self._items)}


class RenderMemo:
    """Rendered texts of recent conversations, keyed by a digest of their exact JSON, in a byte budget.

    Only plain JSON values are keyed (dicts with string keys, lists, strings, ints, finite floats, bools,
    None), where equal JSON means equal values to the template; anything else is rendered every time.

    The key is the 16-byte keyed BLAKE2b of the JSON, not the JSON (a conversation's JSON is as large as
    its text: keeping it doubled what the memo held). Equal digests stand for equal JSON: the key is a
    secret drawn per process, so no one can search for two conversations that collide (keyed BLAKE2b is
    a pseudorandom function: without the key a collision takes about 2**128 tries, and a request learns
    nothing of the digests), and by chance, with n lookups against at most m entries, a collision has
    probability below n*m / 2**128 (1e12 lookups against 1e6 entries: 3e-21)."""

    def __init__(self, *, enabled: bool = True, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.enabled = enabled and max_bytes > 0
        self._texts: ByteLru[bytes, str] = ByteLru(max_bytes)
        self._secret = secrets.token_bytes(32)

    @property
    def max_bytes(self) -> int:
        return self._texts.max_bytes

    def key(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None,
            add_generation_prompt: bool, template_kwargs: Mapping[str, Any] | None = None) -> bytes | None:
        value = [list(messages), list(tools) if tools else None, add_generation_prompt]
        if template_kwargs:
            value.append(dict(template_kwargs))
        if not self.enabled or not _plain_json(value):
            return None
        return hashlib.blake2b(orjson.dumps(value), digest_size=16, key=self._secret).digest()

    def get(self, key: bytes | None) -> str | None:
        return None if key is None else self._texts.get(key)

    def put(self, key: bytes | None, text: str) -> None:
        if key is not None:
            self._texts.put(key, text, sys.getsizeof(text) + sys.getsizeof(key))

    def memory(self) -> dict[str, int]:
        return self._texts.memory()


def _plain_json(value: Any) -> bool:
    if value is None or type(value) in (str, int, bool):
        return True
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is list:
        return all(_plain_json(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _plain_json(v) for k, v in value.items())
    return False


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


def piecewise_decoding(config: dict[str, Any]) -> bool:
    """Whether a tokenizer (its ``tokenizer.json`` as a dict) decodes ids piecewise: its decoder is
    byte-level alone, so every id stands for fixed bytes and ``decode`` is the (lossy) UTF-8 decoding
    of the ids' bytes joined. Then ids whose bytes are valid UTF-8 decode piece by piece:
    ``decode(a + b) == decode(a) + decode(b)``, and a decoded text without U+FFFD shows the bytes were
    valid (lossy decoding marks every invalid sequence with it). A spliced prompt made of such pieces,
    each known to decode to its part of the rendered text, decodes to the whole text: proven without
    decoding the earlier prompts again."""
    model = config.get("model") or {}
    return ((config.get("decoder") or {}).get("type") == "ByteLevel"
            and model.get("type") == "BPE" and not model.get("byte_fallback"))


# Pre-tokenizers that only cut text into pieces, keeping every character (unless told to remove some).
_SPLITTING_PRE_TOKENIZERS = {"Split", "Digits", "Punctuation"}


def round_trip_rule(config: dict[str, Any]) -> str | None:
    """For which texts ``decode(encode(text)) == text`` holds by construction, for a tokenizer (its
    ``tokenizer.json`` as a dict) that decodes piecewise: ``"any"``, ``"ascii"`` (an NFC normalizer
    leaves ASCII alone, other text maybe not), or None (not provable: decode and compare).

    Encoding splits out added tokens (each decodes to its own text: checked on the tokenizer itself,
    ``ChatRenderer._added_tokens_round_trip``); the rest is normalized (a no-op by the rule), cut into
    pieces keeping every character, mapped byte by byte to the 256 characters of the byte-level alphabet
    (every one in the vocabulary, so BPE never drops a byte or emits an unknown token) and merged by BPE,
    whose tokens' strings join to exactly those characters. Decoding maps the same characters back to the
    same bytes, so valid UTF-8 text comes back unchanged. Anything that adds, removes or rewrites
    characters on the way (a prefix space, stripping added tokens, subword markers, padding,
    truncation, a model id whose token is not the added token's text) makes the rule None."""
    from tokenizers.pre_tokenizers import ByteLevel

    model = config.get("model") or {}
    vocab: dict[str, int] = model.get("vocab") or {}
    if not piecewise_decoding(config) or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") \
            or config.get("truncation") or config.get("padding"):
        return None
    if not all(ch in vocab for ch in ByteLevel.alphabet()) or len(set(vocab.values())) != len(vocab):
        return None
    added = config.get("added_tokens") or []
    by_id = {int(t["id"]): t["content"] for t in added}
    if any(t.get("lstrip") or t.get("rstrip") for t in added) \
            or any(by_id[i] != token for token, i in vocab.items() if i in by_id):
        return None
    if not _keeps_characters(config.get("pre_tokenizer")) or not adds_nothing(config.get("post_processor")):
        return None
    return _normalized_texts(config.get("normalizer"))


def _keeps_characters(node: dict[str, Any] | None) -> bool:
    """A byte-level pre-tokenizer (exactly one ByteLevel, no prefix space) that only cuts text."""
    steps = (node or {}).get("pretokenizers", []) if (node or {}).get("type") == "Sequence" else [node]
    byte_level = [s for s in steps if s and s.get("type") == "ByteLevel"]
    return len(byte_level) == 1 and not byte_level[0].get("add_prefix_space") and all(
        s is not None and (s.get("type") == "ByteLevel" or (
            s.get("type") in _SPLITTING_PRE_TOKENIZERS and s.get("behavior") != "Removed"))
        for s in steps)


def _normalized_texts(node: dict[str, Any] | None) -> str | None:
    """Which texts the normalizer leaves unchanged: "any" (none), "ascii" (NFC alone), else None."""
    if not normalizer_steps(node):
        return "any"
    return "ascii" if nfc_only(node) else None


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


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        return "".join(str(p.get("text", "")) for p in parts)
    return str(content)


def _reasoning_of(message: Message) -> str:
    return str(message.get("reasoning_content") or message.get("reasoning") or "")


def _message_key(message: Message) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What must agree for a history message to be the output of an earlier call: the content and the
    tool calls (name and arguments as JSON values). Ids and reasoning may be dropped by harnesses."""
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", call) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        calls.append((str(function.get("name", "")), json.dumps(arguments, sort_keys=True)))
    return _text_of(message.get("content")), tuple(calls)


def _match_messages(messages: Sequence[Message], prior_calls: Sequence[PriorCall],
                    outputs: Mapping[int, _OutputView]) -> dict[int, int]:
    """Assistant message index -> the earlier call that produced it (latest unused call that matches,
    walking the history backwards so that repeated identical outputs pair up in order)."""
    by_key: dict[tuple[str, tuple[tuple[str, str], ...]], list[int]] = {}
    for call in prior_calls:
        by_key.setdefault(_message_key(outputs[call.call_index].message), []).append(call.call_index)
    matches: dict[int, int] = {}
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") != "assistant":
            continue
        candidates = by_key.get(_message_key(message))
        if candidates:
            matches[index] = candidates.pop()
    return matches


def _latest_matched(matches: Mapping[int, int]) -> tuple[int, int] | None:
    if not matches:
        return None
    index = max(matches)
    return index, matches[index]


def _sentinels(text: str, count: int) -> list[str]:
    salt = 0
    while True:
        candidates = [f"\u2063tt-splice-{salt}-{k}\u2063" for k in range(count)]
        if not any(s in text for s in candidates):
            return candidates
        salt += 1


def _split_on(text: str, separators: Sequence[str]) -> list[str] | None:
    """``text`` split at each separator in order, or None if they do not occur exactly once each."""
    parts: list[str] = []
    rest = text
    for separator in separators:
        if rest.count(separator) != 1:
            return None
        before, rest = rest.split(separator)
        parts.append(before)
    parts.append(rest)
    return parts


def _body_end(text: str, pos: int, after: str, is_last: bool) -> int | None:
    """Where the message body starting at ``pos`` ends: just before the template text that follows it.
    The last body is followed by the rest of the prompt, so it is located from the end."""
    if is_last:
        return len(text) - len(after) if text.endswith(after) and len(text) - len(after) >= pos else None
    found = text.find(after, pos)
    return None if found < 0 else found


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _snippet(text: str, at: int, width: int = 24) -> str:
    return repr(text[at:at + width])


def _short(text: str, width: int = 60) -> str:
    return repr(text if len(text) <= width else text[: width - 3] + "...")
