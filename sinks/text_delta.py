"""Harness request bodies stored as verified deltas on the body of an earlier call.

An agent harness sends the whole conversation on every call, so call k's request body repeats call
k-1's almost entirely: the same messages up to where k-1 ended, then the new turn, then the same tools,
system prompt and parameters. Stored in full, bodies grow with the square of the rollout length (and
dwarf the token columns). Stored as a delta, a body keeps only what differs from its base body: the
text between the longest shared prefix and the longest shared suffix. Rebuilding is exact and checked
against the full body's length and sha256.

Pure functions and a bounded memo; the sink decides which earlier body is available as a base.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass


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
