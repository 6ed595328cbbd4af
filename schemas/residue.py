"""Residue matching: is any readable content of a forgotten subject left? (pure: bytes and values in, hits out)

Forgetting (issue 31) destroys a subject's data key and blanks or removes its stored copies; the proof
that it worked is a scan that finds none of the subject's content anywhere. The scan looks for two kinds
of needle, which the caller knows because it planted or recorded them before the forget:

* canaries: strings planted in the subject's content (a prompt, a tool result, a feedback text). They are
  looked for in every form a store keeps text in: UTF-8, JSON-escaped (``\\u00e9``, ``\\"``) and
  HTML-escaped (the report), in raw bytes and in decoded strings.
* token runs: the subject's token ids (its prompt or output tokens). A run is looked for as a contiguous
  sub-sequence of ONE integer array at a time (a packed little-endian uint32 ``bytes`` field, an Avro or
  ClickHouse array, a JSON list) at element boundaries, and as packed uint32 bytes or as a written list
  (``12, 34, 56``) in raw bytes. A run that only appears across the end of one array and the start of the
  next is not content of one field, and is not reported.

What AES-GCM ciphertext hides is not found (the test suite proves it), so a record whose content fields are
encrypted under a destroyed key counts as unreadable, which is the point of crypto-shredding.

The adapters (``schemas/kafka/residue.py``, ``producers/delivery/residue.py``, ``sinks/residue.py``) read the
stores and feed bytes and decoded values to a ``Matcher``; a ``Tally`` collects what was scanned and where
anything was found. Nothing here does I/O.
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.codec import CONFLUENT_MAGIC, SINGLE_OBJECT_MAGIC, Codec, DecodeError

# A run shorter than this matches too much by chance (a 500-token vocabulary repeats 3-grams in any large
# store), so it is refused rather than reported as residue.
MIN_TOKEN_RUN = 4
# Strings longer than this are not parsed as JSON in search of token lists (their text is still searched).
MAX_JSON_CHARS = 64 * 1024 * 1024
# Nested decoding (a dead letter's value, JSON in JSON) stops this deep.
MAX_DEPTH = 8

_U32 = np.dtype("<u4")
_I64 = np.dtype("<i8")

# Decodes bytes that may be an encoded record (a topic's value, a dead letter's value); None when they are not one.
RecordDecoder = Callable[[bytes], Any]
# Opens bytes that may be sealed content with any data key that still exists (the key store, unwrapped by the
# master key); the opened content (bytes, text or a record), or None when they are not sealed or no key opens
# them. With it the scan proves more than "the stores hold ciphertext": nothing of a forgotten subject can be
# read by anyone who holds the master key and every key that is left.
Unsealer = Callable[[bytes], Any]


def record_decoder(codec: Codec) -> RecordDecoder:
    """The contract's records through ``codec``; anything it cannot read (ciphertext, other bytes) is None."""
    def decode(data: bytes) -> Any:
        if data[:2] != SINGLE_OBJECT_MAGIC and data[:1] != CONFLUENT_MAGIC:
            return None  # not framed as a record (packed ids, text): no need to ask the codec
        try:
            return codec.decode(data)[1]
        except DecodeError:
            return None
    return decode


@dataclass(frozen=True)
class Hit:
    """One needle found in one field of a location (``field`` as a path: ``value``, ``decoded.request_json``)."""

    field: str
    needle: str  # ``canary[0]`` or ``tokens[1]``: a label, never the content itself


@dataclass(frozen=True)
class Needles:
    canaries: tuple[str, ...] = ()
    token_runs: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if not self.canaries and not self.token_runs:
            raise ValueError("nothing to look for: give at least one canary string or token run")
        for i, canary in enumerate(self.canaries):
            if len(canary) < 4:
                raise ValueError(f"canary[{i}] has {len(canary)} characters; use a unique string of at least 4")
        for i, run in enumerate(self.token_runs):
            if len(run) < MIN_TOKEN_RUN:
                raise ValueError(f"tokens[{i}] has {len(run)} ids; a run of fewer than {MIN_TOKEN_RUN} matches "
                                 "by chance, give a longer one")
            if any(not 0 <= t <= 0xFFFFFFFF for t in run):
                raise ValueError(f"tokens[{i}] holds an id outside uint32")
            if len(set(run)) == 1:
                raise ValueError(f"tokens[{i}] repeats one id; it would match padding and blanked (zero-filled) "
                                 "token arrays, give a run of the subject's own tokens")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Needles:
        """``{"canaries": [...], "token_runs": [[...], ...]}`` (what ``to_json`` writes)."""
        return cls(tuple(str(c) for c in data.get("canaries", ())),
                   tuple(tuple(int(t) for t in run) for run in data.get("token_runs", ())))

    def to_json(self) -> dict[str, Any]:
        return {"canaries": list(self.canaries), "token_runs": [list(run) for run in self.token_runs]}


def canary_token_run(encode: Callable[[str], Sequence[int]], canary: str, trim: int = 1) -> tuple[int, ...]:
    """The token ids a canary leaves in any prompt or output: its encoding between spaces with ``trim``
    tokens cut from each end, which can merge with the text around it. ``encode``: the model's tokenizer
    (no special tokens). Raises ValueError when what is left is too short to be a needle."""
    ids = [int(t) for t in encode(f" {canary} ")]
    run = tuple(ids[trim:len(ids) - trim])
    if len(run) < MIN_TOKEN_RUN:
        raise ValueError(f"the canary encodes to {len(ids)} tokens, {len(run)} after trimming; "
                         f"use a longer one (at least {MIN_TOKEN_RUN} tokens must be left)")
    return run


def _text_forms(canary: str) -> set[str]:
    """The ways a store writes the canary down: as is, JSON-escaped (both ways), HTML-escaped."""
    return {canary, json.dumps(canary)[1:-1], json.dumps(canary, ensure_ascii=False)[1:-1],
            html.escape(canary), html.escape(canary, quote=False)}


def _written_list(run: tuple[int, ...]) -> re.Pattern[bytes]:
    """The run written as a list of decimals (JSON, Python, a log line), not inside a longer number."""
    return re.compile(rb"(?<![0-9])" + rb"\s*,\s*".join(str(t).encode() for t in run) + rb"(?![0-9])")


def _find_aligned(haystack: bytes, needle: bytes, stride: int) -> bool:
    """``needle`` at an offset that is a multiple of ``stride``: on an element boundary of the array."""
    at = haystack.find(needle)
    while at != -1:
        if at % stride == 0:
            return True
        at = haystack.find(needle, at + 1)
    return False


class Matcher:
    """Finds the needles in raw bytes, in strings, in integer arrays, and in decoded values (recursively)."""

    def __init__(self, needles: Needles, decode: RecordDecoder | None = None, unseal: Unsealer | None = None) -> None:
        self.needles = needles
        self._decode = decode
        self._unseal = unseal
        self._canary_text = [(f"canary[{i}]", sorted(_text_forms(c))) for i, c in enumerate(needles.canaries)]
        self._runs_u32 = [(f"tokens[{i}]", np.asarray(r, dtype=_U32).tobytes())
                          for i, r in enumerate(needles.token_runs)]
        self._runs_i64 = [(f"tokens[{i}]", np.asarray(r, dtype=_I64).tobytes())
                          for i, r in enumerate(needles.token_runs)]
        # (label, the run's first id as text, the pattern): the regex runs only where its first id occurs, which
        # a substring test finds far faster than the pattern's look-behind lets the regex engine.
        self._runs_written = [(f"tokens[{i}]", str(r[0]), _written_list(r)) for i, r in enumerate(needles.token_runs)]
        self._flat_text = [(label, form) for label, forms in self._canary_text for form in forms]
        self._flat_bytes = [(label, form.encode()) for label, form in self._flat_text]

    # ---- raw bytes (a Kafka key, value or header; a file; a spool frame) -------------------------------

    def in_bytes(self, data: bytes | bytearray | memoryview | None, where: str) -> list[Hit]:
        """Canaries in any of their forms, token runs packed as uint32 at any offset or written as a list."""
        if not data:
            return []
        blob = bytes(data)
        hits = [Hit(where, label) for label, form in self._flat_bytes if form in blob]
        for (label, packed), (_, first, written) in zip(self._runs_u32, self._runs_written, strict=True):
            if packed in blob or (first.encode() in blob and written.search(blob)):
                hits.append(Hit(where, label))
        return list(dict.fromkeys(hits))

    # ---- decoded values ---------------------------------------------------------------------------------

    def in_text(self, text: str, where: str) -> list[Hit]:
        hits = [Hit(where, label) for label, form in self._flat_text if form in text]
        for label, first, written in self._runs_written:
            if first in text and written.search(text.encode("utf-8", "surrogatepass")):
                hits.append(Hit(where, label))
        return list(dict.fromkeys(hits))

    def in_ints(self, values: Any, where: str) -> list[Hit]:
        """Token runs as contiguous sub-sequences of one integer array (a list or a numpy array)."""
        arr = np.asarray(values)
        if arr.size < MIN_TOKEN_RUN or arr.dtype.kind not in "iu":
            return []
        blob = arr.astype(_I64, copy=False).tobytes()
        return [Hit(where, label) for label, packed in self._runs_i64 if _find_aligned(blob, packed, _I64.itemsize)]

    def in_packed(self, data: bytes, where: str) -> list[Hit]:
        """Token runs in a ``bytes`` field read as packed little-endian uint32 (the contract's token arrays)."""
        if len(data) % 4 or len(data) < 4 * MIN_TOKEN_RUN:
            return []
        return [Hit(where, label) for label, packed in self._runs_u32 if _find_aligned(data, packed, 4)]

    def in_encoded(self, data: bytes | None, where: str) -> list[Hit]:
        """An encoded record (a Kafka value, a spool frame), decoded and walked; a value that is not a record
        but sealed content, opened and walked; nothing if neither."""
        if not data:
            return []
        blob = bytes(data)
        record = self._decode(blob) if self._decode is not None else None
        if record is not None:
            return self.in_value(record, where)
        opened = self._unseal(blob) if self._unseal is not None else None
        return [] if opened is None else self.in_value(opened, f"{where}>unsealed")

    def in_value(self, value: Any, where: str, depth: int = 0) -> list[Hit]:
        """Walk a decoded record, a ClickHouse row value or parsed JSON; duplicates removed, order kept."""
        return list(dict.fromkeys(self._walk(value, where, depth)))

    def _walk(self, value: Any, where: str, depth: int) -> Iterator[Hit]:
        if value is None or isinstance(value, bool | int | float):
            return
        if isinstance(value, str):
            yield from self.in_text(value, where)
            if value[:1] in ("{", "["):
                yield from self._json_inside(value, where, depth)
        elif isinstance(value, bytes | bytearray | memoryview):
            blob = bytes(value)
            yield from self.in_bytes(blob, where)
            yield from self.in_packed(blob, where)
            if depth < MAX_DEPTH and self._decode is not None:
                decoded = self._decode(blob)
                if decoded is not None:
                    yield from self._walk(decoded, f"{where}>decoded", depth + 1)
            if depth < MAX_DEPTH and self._unseal is not None:
                opened = self._unseal(blob)
                if opened is not None:
                    yield from self._walk(opened, f"{where}>unsealed", depth + 1)
            if blob[:1] in (b"{", b"["):
                try:
                    yield from self._json_inside(blob.decode("utf-8"), where, depth)
                except UnicodeDecodeError:
                    pass
        elif isinstance(value, np.ndarray):
            if value.dtype.kind in "iu":
                yield from self.in_ints(value, where)
            else:
                for i, item in enumerate(value.tolist()):
                    yield from self._walk(item, f"{where}[{i}]", depth)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                yield from self._walk(key, f"{where}.<key>", depth)
                yield from self._walk(item, f"{where}.{key}" if where else str(key), depth)
        elif isinstance(value, list | tuple):
            if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                yield from self.in_ints(value, where)
            else:
                for i, item in enumerate(value):
                    yield from self._walk(item, f"{where}[{i}]", depth)

    def _json_inside(self, text: str, where: str, depth: int) -> Iterator[Hit]:
        """Token lists inside a JSON document held in a string (a request body with token-id prompts)."""
        if depth >= MAX_DEPTH or len(text) > MAX_JSON_CHARS:
            return
        try:
            parsed = json.loads(text)
        except ValueError:
            return
        yield from self._walk(parsed, f"{where}>json", depth + 1)


@dataclass(frozen=True)
class Location:
    """Where readable content remains: a store, a place in it, and which needles in which fields."""

    store: str  # kafka | spool | clickhouse | report | file
    where: str  # ``topic[partition]@offset``, ``path#seq``, ``db.table event_id=...``, a path
    hits: tuple[Hit, ...]

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "where": self.where,
                "needles": sorted({h.needle for h in self.hits}), "fields": sorted({h.field for h in self.hits})}


@dataclass
class Tally:
    """What a scan looked at (per store) and every location with readable content; ``complete`` turns
    false when a store could not be read to its end (then a zero is not a proof)."""

    scanned: Counter[str] = field(default_factory=Counter)
    locations: list[Location] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def add(self, store: str, where: str, hits: Iterable[Hit]) -> bool:
        found = tuple(dict.fromkeys(hits))
        if found:
            self.locations.append(Location(store, where, found))
        return bool(found)

    def count(self, what: str, n: int = 1) -> None:
        self.scanned[what] += n

    @property
    def residual_readable(self) -> int:
        return len(self.locations)

    @property
    def complete(self) -> bool:
        return not self.incomplete

    def by_store(self) -> dict[str, int]:
        return dict(sorted(Counter(loc.store for loc in self.locations).items()))

    def by_needle(self) -> dict[str, int]:
        return dict(sorted(Counter(h for loc in self.locations for h in {x.needle for x in loc.hits}).items()))

    def summary(self, max_locations: int = 50) -> dict[str, Any]:
        """The figures of the scan as one JSON-ready object (the command's last line)."""
        return {
            "residual_readable": self.residual_readable,
            "complete": self.complete,
            "by_store": self.by_store(),
            "by_needle": self.by_needle(),
            "scanned": dict(sorted(self.scanned.items())),
            "incomplete": list(self.incomplete),
            "skipped": list(self.skipped),
            "locations": [loc.to_json() for loc in self.locations[:max_locations]],
        }
