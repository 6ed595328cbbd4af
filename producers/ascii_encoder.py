"""Exact tokenization of ASCII text, about five times faster than the ``tokenizers`` pipeline.

A byte-level BPE encode in Hugging Face ``tokenizers`` spends most of its time in the pre-tokenizer's
regular expression (Oniguruma) and in building per-token objects; the BPE merges themselves are cached
per word. For ASCII text, ``AsciiEncoder`` runs the same pipeline with Python's ``re``:

1. added tokens are split out as the tokenizer does it: leftmost-longest, the non-normalized ones on the
   raw text, then the normalized ones in what is left (the only normalizers accepted, none or NFC
   alone, leave ASCII unchanged);
2. each remaining piece is cut by the pre-tokenizer's own patterns (each ``Split`` step's, then
   ``ByteLevel``'s built-in GPT-2 pattern when it uses one), translated to ASCII classes: ``\\p{L}`` is
   ``[A-Za-z]`` and ``\\p{N}`` is ``[0-9]`` on ASCII, and ``\\s``, ``\\d``, ``\\w`` mean the same ASCII
   characters in both engines (``\\s``: tab, LF, VT, FF, CR, space), which match alike (backtracking,
   ordered alternation, greedy quantifiers);
3. each part is mapped to the byte-level alphabet and tokenized by the tokenizer's own BPE model,
   memoized per part as the model itself caches words.

Only configurations this argument covers get an encoder (``AsciiEncoder.for_tokenizer`` returns None
for the rest), and an encoder is used only after it gave the real pipeline's ids on an adversarial
sample (every ASCII character, contractions, whitespace runs, added tokens touching text). A text it
cannot vouch for (not ASCII, or a split the argument does not cover) gets None: the caller tokenizes it
with the tokenizer itself.
"""

from __future__ import annotations

import json
import logging
import re
from itertools import chain
from typing import Any

from producers.tokenizer_config import adds_nothing, leaves_ascii_alone

log = logging.getLogger("tokentrail.tokenize")

# The pattern ``ByteLevel(use_regex=True)`` splits with (GPT-2's), in Oniguruma syntax.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Memoized parts before the memo starts over (a part is a word or a run of spaces or punctuation).
MAX_MEMO_PARTS = 1 << 17
# Escapes that mean the same on ASCII text in Oniguruma (Unicode) and in Python's ``re`` with re.ASCII.
_SAME_ESCAPES = set("sSdDwWrntfv")
# Groups both engines read alike.
_SAME_GROUPS = ("(?:", "(?i:", "(?!", "(?=")


def ascii_pattern(onig: str) -> re.Pattern[str] | None:
    """``onig`` (an Oniguruma pattern from a ``tokenizer.json``) as a Python pattern that splits ASCII
    text exactly alike, or None where its syntax is outside what both engines read the same way."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(onig):
        c = onig[i]
        if c == "\\":
            if onig.startswith(("\\p{L}", "\\p{N}"), i):
                letters = onig[i + 3] == "L"
                chars = "A-Za-z" if letters else "0-9"
                out.append(chars if in_class else f"[{chars}]")
                i += 5
                continue
            nxt = onig[i + 1] if i + 1 < len(onig) else ""
            if nxt in _SAME_ESCAPES or (nxt and not nxt.isalnum() and nxt.isascii()):
                out.append(c + nxt)
                i += 2
                continue
            return None  # \p{Lu}, \h, \R, \x.., \G ...: not read alike, or not worth proving
        if in_class:
            if c == "[" or onig.startswith("&&", i):  # nested classes, intersections: Oniguruma only
                return None
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            out.append(c)
            i += 1
            if onig.startswith("^", i):
                out.append("^")
                i += 1
            if onig.startswith("]", i):  # a leading "]" is a literal in one engine, an error in the other
                return None
            continue
        elif c in "^$" or (onig.startswith("(?", i) and not onig.startswith(_SAME_GROUPS, i)):
            # ^ and $ anchor lines in Oniguruma's default syntax, the string in Python's; other groups
            # (lookbehind, atomic, inline flags for the rest of the pattern) are not proven alike.
            return None
        out.append(c)
        i += 1
    if in_class:
        return None
    try:
        return re.compile("".join(out), re.ASCII)
    except re.error:
        return None


class AsciiEncoder:
    """``tokenizer.encode(text, add_special_tokens=False).ids`` for ASCII text; see the module docstring."""

    def __init__(self, tokenizer: Any, patterns: list[re.Pattern[str]], added: list[tuple[str, int, bool]],
                 byte_table: dict[int, str]) -> None:
        self._model = tokenizer.model
        self._patterns = patterns
        self._ids = {content: token_id for content, token_id, _ in added}
        self._raw_added = _literal_pattern([c for c, _, normalized in added if not normalized])
        self._normalized_added = _literal_pattern([c for c, _, normalized in added if normalized])
        self._byte_table = byte_table
        self._memo: dict[str, tuple[int, ...]] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, config: dict[str, Any] | None = None) -> AsciiEncoder | None:
        """An encoder for ``tokenizer`` (a ``tokenizers.Tokenizer``), or None where its configuration is
        outside the argument or the encoder does not reproduce it on the sample."""
        config = config if config is not None else json.loads(tokenizer.to_str())
        patterns = _split_patterns(config)
        if patterns is None or bool(getattr(tokenizer, "encode_special_tokens", False)):
            return None
        added_config = config.get("added_tokens") or []
        if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in added_config):
            return None
        added = [(str(t["content"]), int(t["id"]), bool(t.get("normalized"))) for t in added_config]
        from tokenizers.pre_tokenizers import ByteLevel

        mapper = ByteLevel(add_prefix_space=False, use_regex=False)
        byte_table = {b: "".join(p for p, _ in mapper.pre_tokenize_str(chr(b))) for b in range(128)}
        encoder = cls(tokenizer, patterns, added, byte_table)
        mismatch = encoder._self_check(tokenizer, [t for t, _, _ in added])
        if mismatch is not None:
            log.warning("fast ASCII tokenization disabled: it gave other ids than the tokenizer for %r", mismatch)
            return None
        return encoder

    def encode(self, text: str) -> list[int] | None:
        """The ids of ``text``, or None when it is not ASCII or splits in a way not covered here."""
        if not text.isascii():
            return None
        out: list[int] = []
        for segment, added_id in _split_added(text, self._raw_added, self._ids):
            if added_id is not None:
                out.append(added_id)
                continue
            for piece, normalized_id in _split_added(segment, self._normalized_added, self._ids):
                if normalized_id is not None:
                    out.append(normalized_id)
                elif not self._encode_piece(piece, out):
                    return None
        return out

    def _encode_piece(self, piece: str, out: list[int]) -> bool:
        parts = [piece]
        for pattern in self._patterns:
            cut: list[str] = []
            for part in parts:
                matched = pattern.findall(part)
                # The tokenizer keeps unmatched gaps as parts of their own and never yields empty ones;
                # findall shows neither, so a text where either could happen is left to the tokenizer.
                if sum(map(len, matched)) != len(part) or "" in matched:
                    return False
                cut += matched
            parts = cut
        memo = self._memo
        found = list(map(memo.get, parts))
        if None in found:
            if len(memo) >= MAX_MEMO_PARTS:
                memo.clear()
            for n, ids in enumerate(found):
                if ids is None:  # the memo again first: a part can recur within the text
                    part = parts[n]
                    ids = memo.get(part)
                    if ids is None:
                        ids = memo[part] = tuple(t.id for t in self._model.tokenize(part.translate(self._byte_table)))
                    found[n] = ids
        out.extend(chain.from_iterable(found))  # type: ignore[arg-type]  # no None left
        return True

    def _self_check(self, tokenizer: Any, added: list[str]) -> str | None:
        """The first sample text whose ids differ from the tokenizer's, or None if none does."""
        for text in _sample_texts([a for a in added if a.isascii()]):
            ids = self.encode(text)  # None: left to the tokenizer, which is never wrong
            if ids is not None and ids != tokenizer.encode(text, add_special_tokens=False).ids:
                return text
        return None


def _split_patterns(config: dict[str, Any]) -> list[re.Pattern[str]] | None:
    """The ASCII patterns the pre-tokenizer splits with, in order, when the whole configuration is covered
    by the module's argument; else None."""
    model = config.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") or config.get("truncation") or config.get("padding"):
        return None
    if not leaves_ascii_alone(config.get("normalizer")) or not adds_nothing(config.get("post_processor")):
        return None
    node = config.get("pre_tokenizer") or {}
    pre = (node.get("pretokenizers") or []) if node.get("type") == "Sequence" else [node]
    if not pre or pre[-1].get("type") != "ByteLevel" or pre[-1].get("add_prefix_space"):
        return None
    sources: list[str] = []
    for step in pre[:-1]:
        regex = (step.get("pattern") or {}).get("Regex")
        if step.get("type") != "Split" or regex is None or step.get("behavior") != "Isolated" or step.get("invert"):
            return None
        sources.append(regex)
    if pre[-1].get("use_regex", True):
        sources.append(GPT2_PATTERN)
    patterns = [ascii_pattern(source) for source in sources]
    return None if any(p is None for p in patterns) else [p for p in patterns if p is not None]


def _literal_pattern(literals: list[str]) -> re.Pattern[str] | None:
    """Leftmost-longest matching of literal strings (as the tokenizer's added-token automaton)."""
    literals = sorted({lit for lit in literals if lit}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, literals))) if literals else None


def _split_added(text: str, pattern: re.Pattern[str] | None,
                 ids: dict[str, int]) -> list[tuple[str, int | None]]:
    """``text`` as (piece, None) for plain text and (token, id) for each added token in it."""
    if pattern is None:
        return [(text, None)] if text else []
    out: list[tuple[str, int | None]] = []
    pos = 0
    for match in pattern.finditer(text):
        if match.start() > pos:
            out.append((text[pos:match.start()], None))
        out.append((match.group(), ids[match.group()]))
        pos = match.end()
    if pos < len(text):
        out.append((text[pos:], None))
    return out


def _sample_texts(added: list[str]) -> list[str]:
    """Texts where a wrong split would show: every ASCII character, contractions in both cases, digits,
    runs of each kind of whitespace, punctuation runs, added tokens touching text and cut short."""
    every = "".join(map(chr, range(128)))
    words = ["don't", "I'M", "we'Ve", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "x's", "''s",
             "12345", "3.14", "1,000", "a1b2", "_x_", "foo_bar", "CamelCase", "!!!", "?!.", "...", "--", "(x)",
             "\"q\"", "a\tb", "a \tb", "\r\n", "\n\n\n", " \n ", "  \n", "\t\t", "\x0b\x0c", "\x1c\x1d\x1e\x1f",
             "\x00\x7f", " ", "  ", "   x", "x   ", "'", "\\", "{}", "[]", "<|", "|>", "<", ">"]
    pieces = words + added + [a[: len(a) // 2] for a in added] + [every, every[::-1]]
    texts = [every, every[::-1], " ".join(pieces), "".join(pieces), "\n".join(pieces)]
    for a in added:
        texts += [f"x{a}y", f" {a} ", f"{a}{a}", f"\n{a}\n", f"don't{a}'s", f"{a}   12"]
    for n, w in enumerate(words):
        texts += [w, f" {w}", f"{w} ", f"a{w}b", words[n - 1] + w, w + words[(n + 7) % len(words)]]
    joined = "".join(pieces)
    texts += [joined[i:i + 17] for i in range(0, len(joined), 5)]
    return texts
