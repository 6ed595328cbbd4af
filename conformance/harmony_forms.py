"""Harmony header forms the format leaves open, so that judges disagreeing among themselves is not called drift.

OpenAI's harmony format (``docs/format.md`` in openai/harmony, v0.0.8) writes a message as
``<|start|>{header}<|message|>{content}{end}``. For a tool call it says: the recipient ``to=functions.X`` "might
be defined in the role or channel section of the header", and the model "might also specify a ``<|constrain|>``
token" for the argument type (``<|constrain|>json``). Implementations re-rendering a tool call from the
history use different forms of that one header, each within the format:

* the model samples, and the format's own full example keeps in history,
  ``assistant<|channel|>commentary to=functions.X <|constrain|>json``;
* openai-harmony 0.0.8 puts a recipient in the role section; vLLM 0.32's chat path gives it the content type
  ``json`` (no ``<|constrain|>``): ``assistant to=functions.X<|channel|>commentary json`` (the gateway's render,
  as vLLM serves it);
* renderers 0.1.12 (its gpt-oss conversion): ``assistant to=functions.X<|channel|>commentary``, no content type;
* vLLM 0.32's ``oss-harmony`` fork writes a tool result's recipient in the channel section
  (``functions.X<|channel|>commentary to=assistant``).

``header_variant`` says whether two prompts differ only that way: the same messages in the same order, every
message's content and end token the same ids, and each differing header the same (author, channel, recipient,
content type) once the recipient's place and a JSON content type's spelling (``<|constrain|>json``, ``json``, or
none) are set aside. Any other difference (a content token, a role, channel or recipient, another content type,
a message more or less) is not a variant: it stays a render mismatch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

START, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|message|>", "<|channel|>", "<|constrain|>"
# The one content type the format names as optional on a tool call (the model "might" constrain it).
OPTIONAL_CONTENT_TYPES = frozenset({"json"})


@dataclass(frozen=True)
class Header:
    author: str
    channel: str | None
    recipient: str | None
    content_type: str | None


def parse_header(text: str) -> Header | None:
    """The parts of a header's text (between ``<|start|>`` and ``<|message|>``); None when it has no shape harmony
    writes (two recipients, words that are neither)."""
    role_part, _, channel_part = text.partition(CHANNEL)
    role_words = role_part.split()
    if not role_words:
        return None
    author, recipient, channel, content_type = role_words[0], None, None, None
    for word in role_words[1:]:
        if not word.startswith("to=") or recipient is not None:
            return None
        recipient = word[3:]
    words = channel_part.replace(CONSTRAIN, f" {CONSTRAIN} ").split()
    if words:
        channel = words.pop(0)
    for word in words:
        if word.startswith("to="):
            if recipient is not None:
                return None
            recipient = word[3:]
        elif word == CONSTRAIN:
            continue  # the marker before a content type
        elif content_type is None:
            content_type = word
        else:
            return None
    return Header(author, channel, recipient, content_type)


def _same_message(a: Header, b: Header) -> bool:
    def kind(h: Header) -> str | None:
        return None if h.content_type in OPTIONAL_CONTENT_TYPES else h.content_type

    return (a.author, a.channel, a.recipient, kind(a)) == (b.author, b.channel, b.recipient, kind(b))


def _messages(ids: Sequence[int], start: int, message: int) -> list[tuple[list[int], list[int] | None]]:
    """(header ids, content ids through the end token) per message; the trailing generation prompt has no
    ``<|message|>``: its content is None."""
    out: list[tuple[list[int], list[int] | None]] = []
    cuts = [i for i, t in enumerate(ids) if t == start] + [len(ids)]
    if cuts[0] != 0:
        out.append((list(ids[:cuts[0]]), None))  # text before the first message: compared whole
    for lo, hi in itertools.pairwise(cuts):
        chunk = list(ids[lo:hi])
        at = chunk.index(message) if message in chunk else -1
        out.append((chunk, None) if at < 0 else (chunk[:at + 1], chunk[at + 1:]))
    return out


def header_variant(a: Sequence[int], b: Sequence[int], *, start: int, message: int,
                   decode: Callable[[list[int]], str]) -> str | None:
    """What differs, where ``a`` and ``b`` differ only in spec-open header forms; None where they differ otherwise
    (or not at all). ``start``/``message``: the ids of ``<|start|>`` and ``<|message|>``; ``decode``: ids to text
    with the special tokens spelled out."""
    if list(a) == list(b):
        return None
    ma, mb = _messages(a, start, message), _messages(b, start, message)
    if len(ma) != len(mb):
        return None
    forms = []
    for (ha, ca), (hb, cb) in zip(ma, mb, strict=True):
        if ca != cb:
            return None  # a content or end token differs (or one is a generation prompt): not a header form
        if ha == hb:
            continue
        if ca is None:
            return None  # the generation prompt (or leading text) differs
        ta, tb = decode(ha[1:-1]), decode(hb[1:-1])
        pa, pb = parse_header(ta), parse_header(tb)
        if pa is None or pb is None or not _same_message(pa, pb):
            return None
        forms.append(f"{ta!r} vs {tb!r}")
    return "; ".join(sorted(set(forms))) or None
