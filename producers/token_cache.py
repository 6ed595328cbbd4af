"""Incremental tokenization: reuse the ids of an earlier text that starts the new one, tokenize only the rest.

Agentic prompts grow by appending turns, and the rollouts of a group share their task prompt, so most of
a prompt's text was tokenized before, by this process, for another call. ``PrefixTokenCache.encode(text)``
returns exactly ``tokenizer.encode(text, add_special_tokens=False).ids`` while tokenizing only what
follows the longest cached prefix that ends at a safe cut.

Why a cut is safe. A Hugging Face ``tokenizers`` pipeline first splits the text at added tokens
(leftmost-longest literal matches of the non-normalized ones), then normalizes, pre-tokenizes and runs
the model on each piece on its own. Let a cached text P have an added token ending at character c in
its tokenization (token k), and let the new text T agree with P up to c. Then
``encode(T) == encode(P)[:k] + encode(T[c:])`` when:

1. no added token occurs in T across c (it could win the leftmost-longest match and move the piece
   boundary); checked per call;
2. no added token strips whitespace or needs word boundaries (lstrip, rstrip, single_word look across
   c), special tokens are split out (``encode_special_tokens`` off), nothing depends on a piece's absolute
   position (a Metaspace pre-tokenizer that prepends only to the first piece), and nothing truncates,
   pads or samples (BPE dropout); checked once from the tokenizer's own configuration.

Where (2) does not hold only identical texts are reused (tokenization is deterministic); with dropout
nothing is. Cached texts are compared in full before their ids are used, so a hash collision costs a
miss, never a wrong id.

What is left to tokenize goes, piece by piece, to the exact ASCII fast path (``ascii_encoder.py``) where
the tokenizer qualifies and the piece is ASCII, and to the tokenizer itself otherwise.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from producers.ascii_encoder import AsciiEncoder
from producers.tokenizer_config import nfc_only

# Characters hashed to find a cached prefix ending at a cut; the whole prefix is compared before use.
WINDOW = 64
# Pre-tokenizers that treat every piece alike, wherever it is in the text.
_PIECEWISE_PRE_TOKENIZERS = {
    "ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit", "BertPreTokenizer",
    "UnicodeScripts", "CharDelimiterSplit",
}
# Hashable key of a cut: (character position, hash of the text just before it).
_Key = tuple[int, int]
# What an entry costs beside its ids and text (measured with tracemalloc on the reference tokenizer,
# rounded up): the entry object, its slots in the LRU and the index, and each cut's tuples there.
ENTRY_BYTES = 400
CUT_BYTES = 260


@dataclass
class _Entry:
    text: str
    ids: array  # array('I'): 4 bytes a token
    cuts: list[tuple[int, int, _Key]]  # (character end, token count, key) after each anchor token
    end_key: _Key

    @property
    def nbytes(self) -> int:
        """What keeping this entry costs, in bytes (the text as CPython stores it, the ids, the cuts)."""
        return sys.getsizeof(self.text) + self.ids.itemsize * len(self.ids) + ENTRY_BYTES \
            + CUT_BYTES * len(self.cuts)


@dataclass(frozen=True)
class CacheStats:
    exact_hits: int  # the whole text was cached
    prefix_hits: int  # a cached prefix was reused, the rest tokenized
    misses: int
    tokens_reused: int
    tokens_encoded: int
    entries: int
    tokens_held: int
    cuts_enabled: bool  # False: the tokenizer's configuration allows only identical-text reuse
    bytes_held: int  # what the entries cost against ``max_bytes``


def prefix_cuts_are_safe(config: dict[str, Any]) -> bool:
    """Whether the tokenizer (its ``tokenizer.json`` as a dict) tokenizes the pieces between added
    tokens independently of each other, so a cached prefix can be cut at an added token."""
    if config.get("truncation") or config.get("padding"):
        return False
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in config.get("added_tokens", [])):
        return False
    return _pre_tokenizer_is_piecewise(config.get("pre_tokenizer"))


def _pre_tokenizer_is_piecewise(node: dict[str, Any] | None) -> bool:
    if node is None:
        return True
    kind = node.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_is_piecewise(child) for child in node.get("pretokenizers", []))
    if kind == "Metaspace":  # "first" prepends to the piece at offset 0 only
        return node.get("prepend_scheme", "always") in ("always", "never")
    return kind in _PIECEWISE_PRE_TOKENIZERS


def _is_deterministic(config: dict[str, Any]) -> bool:
    return not (config.get("model") or {}).get("dropout")


class PrefixTokenCache:
    """A per-process LRU of tokenized texts, bounded by the bytes it holds (texts, ids and cut points,
    see ``_Entry.nbytes``). Thread-safe.

    ``tokenizer`` is a ``tokenizers.Tokenizer``; ``anchors`` are the added tokens (their text) to cut
    at, typically the turn markers of the chat template (others are ignored)."""

    def __init__(self, tokenizer: Any, anchors: list[str], *, max_bytes: int = 32 * 1024 * 1024,
                 fast_ascii: bool = True) -> None:
        self._tokenizer = tokenizer
        self.max_bytes = max_bytes
        config = json.loads(tokenizer.to_str())
        unsplit_specials = bool(getattr(tokenizer, "encode_special_tokens", False))
        self._ascii_tokenizer = ascii_twin(tokenizer, config)
        self.enabled = _is_deterministic(config) and max_bytes > 0
        # Tokenizes ASCII pieces several times faster than the tokenizer, with the same ids (None: the
        # tokenizer's configuration is not one it covers).
        self.ascii_encoder = AsciiEncoder.for_tokenizer(tokenizer, config) if fast_ascii else None
        added = [t for t in config.get("added_tokens", []) if not t.get("normalized")]
        by_content = {t["content"]: int(t["id"]) for t in added}
        self._anchor_ids = {by_content[a]: a for a in anchors if a in by_content}
        self.cuts_enabled = (self.enabled and prefix_cuts_are_safe(config) and not unsplit_specials
                             and bool(self._anchor_ids))
        # Every added token's text (normalized ones too: cheap, and conservative) for the crossing check;
        # longest first, so a match at a position is the longest added token starting there.
        added = sorted({t["content"] for t in config.get("added_tokens", []) if len(t["content"]) > 1},
                       key=len, reverse=True)
        # A lookahead, so one scan finds the longest added token starting at every position.
        alternatives = "|".join(re.escape(a) for a in added)
        self._added_starts = re.compile(f"(?=({alternatives}))") if added else None
        self._added_max = len(added[0]) if added else 0
        anchors_by_length = sorted(self._anchor_ids.values(), key=len, reverse=True)
        self._anchor_pattern = re.compile("|".join(re.escape(a) for a in anchors_by_length)) \
            if anchors_by_length else None
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # id(entry) -> entry, LRU order
        self._index: dict[_Key, tuple[_Entry, int]] = {}  # cut or end key -> (entry, token count)
        self._tokens_held = 0
        self._bytes_held = 0
        self._lock = threading.Lock()
        self._exact_hits = self._prefix_hits = self._misses = 0
        self._tokens_reused = self._tokens_encoded = 0

    # ------------------------------------------------------------------------------------ the call
    def encode(self, text: str) -> array:
        """``tokenizer.encode(text, add_special_tokens=False).ids`` as a fresh ``array('I')``, reusing
        cached ids where that is exact."""
        if not self.enabled:
            return array("I", self._encode_pieces([text])[0])
        end_key = _key(text, len(text))
        with self._lock:
            hit = self._index.get(end_key)
            if hit is not None and hit[0].text == text:  # the very same text: no tokenization at all
                self._entries.move_to_end(id(hit[0]))
                self._exact_hits += 1
                self._tokens_reused += len(hit[0].ids)
                return array("I", hit[0].ids)
            base, cut, count = self._longest_cut(text) if self.cuts_enabled else (None, 0, 0)
            if base is not None:
                self._entries.move_to_end(id(base))
            head = base.ids[:count] if base is not None else array("I")
            inherited = base.cuts[:bisect_right(base.cuts, cut, key=lambda c: c[0])] if base is not None else []
        # Tokenize outside the lock: the only slow part, and independent of the cache.
        tail, cuts = self._encode_from(text, cut, count)
        ids = head + tail
        with self._lock:
            if base is None:
                self._misses += 1
            else:
                self._prefix_hits += 1
                self._tokens_reused += count
            self._tokens_encoded += len(tail)
            whole = base is not None and len(inherited) == len(base.cuts)
            self._store(_Entry(text, ids, inherited + cuts, end_key), superseded=base if whole else None)
        return array("I", ids)  # the entry keeps its own

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._exact_hits, self._prefix_hits, self._misses, self._tokens_reused,
                              self._tokens_encoded, len(self._entries), self._tokens_held, self.cuts_enabled,
                              self._bytes_held)

    # ------------------------------------------------------------------------------------ lookup
    def _longest_cut(self, text: str) -> tuple[_Entry | None, int, int]:
        """The cached entry, cut and token count of the longest reusable prefix of ``text``."""
        assert self._anchor_pattern is not None
        ends = [m.end() for m in self._anchor_pattern.finditer(text)]
        for cut in reversed(ends):
            found = self._index.get(_key(text, cut))
            if found is None:
                continue
            entry, count = found
            if entry.text[:cut] == text[:cut] and not self._crosses(text, cut):
                return entry, cut, count
        return None, 0, 0

    def _crosses(self, text: str, cut: int) -> bool:
        """Whether an added token occurs in ``text`` starting before ``cut`` and ending after it."""
        if self._added_starts is None:
            return False
        start = max(0, cut - self._added_max + 1)
        window = text[start:cut + self._added_max]
        return any(m.start() < cut - start and m.start() + len(m.group(1)) > cut - start
                   for m in self._added_starts.finditer(window))

    def _encode_from(self, text: str, offset: int, count: int) -> tuple[array, list[tuple[int, int, _Key]]]:
        """The ids of ``text[offset:]`` and the cuts in it (positions in ``text``; ``count`` ids before).

        The text is split after every anchor token the tokenizer will see as one (no added token crosses
        either end of it); the pieces are tokenized in one batch, without offsets. By the argument above,
        their ids joined are the whole text's, and each piece's end is a cut."""
        anchors: dict[int, str] = {}  # piece end -> the anchor text it ends with
        if self.cuts_enabled and self._anchor_pattern is not None:
            for m in self._anchor_pattern.finditer(text, offset):
                if not self._crosses(text, m.start()) and not self._crosses(text, m.end()):
                    anchors[m.end()] = m.group()
        bounds = [offset, *anchors]
        if bounds[-1] < len(text) or len(bounds) == 1:
            bounds.append(len(text))
        pieces = [text[a:b] for a, b in pairwise(bounds)]
        tail = array("I")
        cuts: list[tuple[int, int, _Key]] = []
        for end, ids in zip(bounds[1:], self._encode_pieces(pieces), strict=True):
            tail.extend(ids)
            anchor = anchors.get(end)
            if anchor is None:
                continue
            if not tail or self._anchor_ids.get(tail[-1]) != anchor:  # not what the argument says: no cuts
                return array("I", self._encode_pieces([text[offset:]])[0]), []
            cuts.append((end, count + len(tail), _key(text, end)))
        return tail, cuts

    def _encode_pieces(self, pieces: list[str]) -> list[Sequence[int]]:
        """Each piece's ids: ASCII pieces by the fast encoder where there is one, the rest in one batch."""
        found: list[Sequence[int] | None] = [None] * len(pieces)
        if self.ascii_encoder is not None:
            found = [self.ascii_encoder.encode(piece) for piece in pieces]
        rest = [n for n, ids in enumerate(found) if ids is None]
        if rest:
            texts = [pieces[n] for n in rest]
            for n, encoding in zip(rest, self._for(texts).encode_batch_fast(texts, add_special_tokens=False),
                                   strict=True):
                found[n] = encoding.ids
        return [ids if ids is not None else () for ids in found]

    def _for(self, texts: list[str]) -> Any:
        """The tokenizer to run on ``texts``: the one without a normalizer where that gives the same ids."""
        if self._ascii_tokenizer is not None and all(t.isascii() for t in texts):  # O(1) a text in CPython
            return self._ascii_tokenizer
        return self._tokenizer

    # ------------------------------------------------------------------------------------ storage
    def _store(self, entry: _Entry, superseded: _Entry | None) -> None:
        if entry.nbytes > self.max_bytes:
            return
        # An entry whose every cut the new one repeats is only useful for its identical text; the new
        # one (a later turn of the same conversation, usually) takes its place.
        if superseded is not None and id(superseded) in self._entries:
            self._drop(superseded)
        self._entries[id(entry)] = entry
        self._tokens_held += len(entry.ids)
        self._bytes_held += entry.nbytes
        self._index[entry.end_key] = (entry, len(entry.ids))
        for _, count, key in entry.cuts:
            self._index[key] = (entry, count)
        while self._bytes_held > self.max_bytes:
            _, oldest = next(iter(self._entries.items()))
            self._drop(oldest)

    def _drop(self, entry: _Entry) -> None:
        del self._entries[id(entry)]
        self._tokens_held -= len(entry.ids)
        self._bytes_held -= entry.nbytes
        for key in [entry.end_key, *(c[2] for c in entry.cuts)]:
            found = self._index.get(key)
            if found is not None and found[0] is entry:
                del self._index[key]


def ascii_twin(tokenizer: Any, config: dict[str, Any] | None = None) -> Any | None:
    """A copy of ``tokenizer`` without its normalizer, for ASCII text, when that normalizer is NFC alone;
    else None. NFC leaves ASCII unchanged, and the normalizer is the only step that differs, so both give
    the same ids for ASCII text (added tokens, normalized ones included, match the same text), while
    the normalizer costs about an eighth of tokenizing (measured on the reference tokenizer)."""
    from tokenizers import Tokenizer

    config = config if config is not None else json.loads(tokenizer.to_str())
    if not nfc_only(config.get("normalizer")):
        return None
    twin = Tokenizer.from_str(json.dumps({**config, "normalizer": None}))
    twin.encode_special_tokens = bool(getattr(tokenizer, "encode_special_tokens", False))
    return twin


def _key(text: str, end: int) -> _Key:
    return end, hash(text[max(0, end - WINDOW):end])
