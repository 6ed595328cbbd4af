"""Harness request bodies stored as verified deltas on the body of an earlier call.

An agent harness sends the whole conversation on every call, so call k's request body repeats call
k-1's almost entirely: the same messages up to where k-1 ended, then the new turn, then the same tools,
system prompt and parameters. Stored in full, bodies grow with the square of the rollout length (and
dwarf the token columns). Stored as a delta, a body keeps only what differs from its base body: the
text between the longest shared prefix and the longest shared suffix. Rebuilding is exact and checked
against the full body's length and sha256.

What is left is mostly the new turn: the harness's copy of the base call's answer, then the tool
results. The answer is already stored once, in the base call's response body, as the same JSON string
(the gateway writes both with orjson). So long JSON strings of that response found in the middle are
cut out of it and stored as copies (where in the stored middle, where in the response, how long).

Pure functions and a bounded memo; the sink decides which earlier body is available as a base.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass

# A JSON string token (without its quotes, in group 1) of well-formed JSON text.
_JSON_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
# (position in the stored text, offset in the reference, length), in code points.
Copy = tuple[int, int, int]


class TextDeltaError(ValueError):
    """A delta-stored body cannot be rebuilt exactly."""


@dataclass(frozen=True)
class TextDelta:
    """``text == base[:prefix] + middle + base[len(base) - suffix:]`` (lengths in code points)."""

    prefix: int
    suffix: int
    middle: str


def text_digest(text: str) -> str:
    """hex sha256 of the text's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _shared_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix, by binary search over slice comparisons (C speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _shared_suffix(a: str, b: str, limit: int) -> int:
    """Length (at most ``limit``) of the longest common suffix."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:] == b[len(b) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def encode_delta(text: str, base: str) -> TextDelta:
    """The delta that rebuilds ``text`` from ``base``; prefix and suffix never overlap in either."""
    prefix = _shared_prefix(text, base)
    suffix = _shared_suffix(text, base, min(len(text), len(base)) - prefix)
    return TextDelta(prefix, suffix, text[prefix:len(text) - suffix])


def apply_delta(base: str, delta: TextDelta, length: int, sha256: str) -> str:
    """Rebuild a body and check it against its recorded length and sha256."""
    if delta.prefix < 0 or delta.suffix < 0 or delta.prefix + delta.suffix > len(base):
        raise TextDeltaError(
            f"delta keeps {delta.prefix} + {delta.suffix} characters of a {len(base)}-character base"
        )
    text = base[:delta.prefix] + delta.middle + base[len(base) - delta.suffix:]
    if len(text) != length:
        raise TextDeltaError(f"rebuilt body has {len(text)} characters, the row says {length}")
    if text_digest(text) != sha256:
        raise TextDeltaError("rebuilt body does not match its recorded sha256")
    return text


def cut_copies(text: str, reference: str, min_chars: int) -> tuple[str, list[Copy]]:
    """``text`` without the JSON strings of ``reference`` (JSON text) of at least ``min_chars`` that
    it repeats, and the copies that put them back (``paste_copies``)."""
    spans = sorted(((m.start(1), m.end(1)) for m in _JSON_STRING.finditer(reference)
                    if m.end(1) - m.start(1) >= min_chars), key=lambda s: s[0] - s[1])  # longest first
    found: list[tuple[int, int, int]] = []  # (position in text, offset in reference, length)
    for start, end in spans:
        needle, at = reference[start:end], 0
        while (at := text.find(needle, at)) >= 0:
            if all(at + len(needle) <= p or p + n <= at for p, _, n in found):
                found.append((at, start, len(needle)))
                break
            at += 1
    if not found:
        return text, []
    kept, copies, cursor, stored_len = [], [], 0, 0
    for at, offset, length in sorted(found):
        kept.append(text[cursor:at])
        stored_len += at - cursor
        copies.append((stored_len, offset, length))
        cursor = at + length
    kept.append(text[cursor:])
    return "".join(kept), copies


def paste_copies(stored: str, copies: list[Copy], reference: str) -> str:
    """The text ``cut_copies`` took apart: each copy's slice of ``reference`` back at its position."""
    parts, cursor = [], 0
    for position, offset, length in copies:
        if not cursor <= position <= len(stored) or offset + length > len(reference):
            raise TextDeltaError(f"copy ({position}, {offset}, {length}) is out of range")
        parts += [stored[cursor:position], reference[offset:offset + length]]
        cursor = position
    parts.append(stored[cursor:])
    return "".join(parts)


class RecentTexts:
    """The most recently used texts by key, bounded by their total length in characters."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.chars = 0
        self._texts: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        text = self._texts.get(key)
        if text is not None:
            self._texts.move_to_end(key)
        return text

    def put(self, key: str, text: str) -> None:
        old = self._texts.pop(key, None)
        if old is not None:
            self.chars -= len(old)
        if len(text) > self.max_chars:
            return
        self._texts[key] = text
        self.chars += len(text)
        while self.chars > self.max_chars:
            _, evicted = self._texts.popitem(last=False)
            self.chars -= len(evicted)
