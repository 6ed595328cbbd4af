"""Samples' token columns in the samples table: written by reference to their calls, read back whole.

A sample repeats its calls' tokens: each of its sequences (``sequence_starts``; one unless packed) is
the ``prompt ‖ output`` of the call its last segment names (a merged chain ends with its last call,
whose prompt holds the earlier calls' outputs), and its rollout logprobs are NaN except inside OUTPUT
segments, which carry their call's logprobs. The calls table already stores all of that, so:

* ``input_ids`` is stored empty when ``input_ref_call_ids`` names, per sequence, the call it equals;
* ``rollout_logprobs`` is stored empty when ``logprobs_sha256`` is set (derived from the segments).

Either way the row keeps the sample's token count (``input_length``) and the sha256 of each column
as it was (``input_sha256``, ``logprobs_sha256``). The other columns (mask, advantages, weights) are
not in the calls and compress to almost nothing; they stay.

Writing (``SampleRefs``): the writer references only calls stored no later than the sample: calls it
stores itself (in an earlier batch, or in the same one: calls are inserted first) whose prompts can be
rebuilt from calls it stored (a full prompt, or a delta on a call it admitted), and calls it read back
from ClickHouse with their prompts rebuilt (``sinks.store.encode_samples``). It proves equality with
the calls' hashes (prompt sha256, and sha256s of output ids and logprobs), so it keeps about a hundred
bytes per call, not tokens. Anything it cannot prove is stored in full, exactly as received.

Reading (``rebuild_sample``): the columns are rebuilt from the calls (prompts through their delta
chains) and checked against length and sha256; any failure raises SampleRefError naming the sample.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from schemas.tokens import FLOAT_DTYPE, unpack_int32
from sinks.rows import CallTokens, Row

# Calls remembered as reference targets: ~150 bytes each, enough for the calls of every rollout whose
# samples are still to come on a busy sink.
DEFAULT_MEMO_CALLS = 200_000

# Columns that say how a row's token columns are stored (the migration 0006 defaults mean "in full").
REF_COLUMNS = ("input_ref_call_ids", "input_length", "input_sha256", "logprobs_sha256")
# Columns the rebuild reads besides REF_COLUMNS.
REBUILD_COLUMNS = ("event_id", "seg_call_id", "seg_source", "seg_sample_start", "seg_call_start", "seg_length")
# The bytes of the NaN a sample gives tokens outside the loss (numpy's float32 NaN).
NAN_BYTES = np.array([np.nan], dtype=FLOAT_DTYPE).tobytes()


class SampleRefError(ValueError):
    """A sample row whose referenced token columns cannot be rebuilt exactly."""


def _sha(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()


@dataclass(frozen=True)
class CallDigest:
    """What proves a slice of a sample equals a call: lengths and sha256s of the call's columns."""

    prompt_tokens: int
    prompt_sha256: str  # hex, as the call record carries it
    output_tokens: int
    output_sha256: bytes
    logprobs_sha256: bytes


def call_digest(prompt_tokens: int, prompt_sha256: str, output_ids: bytes, output_logprobs: bytes) -> CallDigest:
    return CallDigest(prompt_tokens, prompt_sha256, len(output_ids) // 4, _sha(output_ids), _sha(output_logprobs))


def row_call_digest(row: Row) -> CallDigest:
    """The digest of a calls row as ``sinks.rows.call_row`` builds it (packed bytes columns)."""
    return call_digest(int(row["prompt_length"]), row["prompt_sha256"], row["output_ids"], row["output_logprobs"])


def is_input_ref(row: Row) -> bool:
    return bool(row.get("input_ref_call_ids"))


def is_logprobs_ref(row: Row) -> bool:
    return bool(row.get("logprobs_sha256"))


def is_ref(row: Row) -> bool:
    return is_input_ref(row) or is_logprobs_ref(row)


def _sequences(row: Row, tokens: int) -> list[tuple[int, int]] | None:
    """[start, end) of each packed sequence; None unless they tile the sample's tokens exactly."""
    packed: bytes = row["sequence_starts"]
    if len(packed) % 4:
        return None
    starts = [int(s) for s in unpack_int32(packed)] if packed else [0]
    ends = [*starts[1:], tokens]
    if starts[0] != 0 or any(lo >= hi for lo, hi in zip(starts, ends, strict=True)):
        return None
    return list(zip(starts, ends, strict=True))


def _last_call(row: Row, lo: int, hi: int) -> str | None:
    """The call of the last segment that starts inside [lo, hi)."""
    inside = [i for i, s in enumerate(row["seg_sample_start"]) if lo <= s < hi]
    return row["seg_call_id"][max(inside, key=lambda i: (row["seg_sample_start"][i], i))] if inside else None


def stored_call_digest(prompt_sha256: str, tokens: CallTokens) -> CallDigest:
    """The digest of a call read back from the calls table (its prompt rebuilt and hash-checked)."""
    return call_digest(len(tokens.prompt), prompt_sha256, tokens.output_ids, tokens.output_logprobs)


class SampleRefs:
    """Rewrites samples rows to reference their calls where the calls were stored first (stateful)."""

    def __init__(self, max_calls: int = DEFAULT_MEMO_CALLS) -> None:
        self.max_calls = max_calls
        self.calls: OrderedDict[str, CallDigest] = OrderedDict()

    def note_call(self, row: Row) -> None:
        """Remember a calls row that will be stored no later than any sample written after this call.

        Only calls whose prompts can be rebuilt from calls this writer stored become targets."""
        base = row.get("prompt_base_call_id")
        if row.get("prompt_ids") is None and (base is None or base not in self.calls):
            self.calls.pop(row["call_id"], None)
            return
        self.note_stored(row["call_id"], row_call_digest(row))

    def note_stored(self, call_id: str, digest: CallDigest) -> None:
        """Remember a call already stored (read back, its prompt rebuilt: a valid target and base)."""
        self.calls[call_id] = digest
        self.calls.move_to_end(call_id)
        while len(self.calls) > self.max_calls:
            self.calls.popitem(last=False)

    def _digest(self, call_id: str | None) -> CallDigest | None:
        return self.calls.get(call_id) if call_id is not None else None

    def encode(self, row: Row) -> Row:
        """Rewrite ``row`` (a samples row as ``sample_row`` builds it, or as this left it) in place:
        each token column this can prove equal to the calls becomes a reference. Safe to repeat."""
        if not is_input_ref(row):
            ids: bytes = row["input_ids"]
            row["input_length"] = len(ids) // 4
            refs = self._input_refs(row, ids, len(ids) // 4)
            if refs:
                row.update(input_ref_call_ids=refs, input_sha256=_sha(ids).hex(), input_ids=b"")
        if not is_logprobs_ref(row) and self._logprobs_derivable(row, int(row["input_length"])):
            row.update(logprobs_sha256=_sha(row["rollout_logprobs"]).hex(), rollout_logprobs=b"")
        return row

    def unknown_calls(self, row: Row) -> set[str]:
        """Calls a samples row needs for the token columns it still stores whole, that this has not seen."""
        wanted: set[str] = set()
        if not is_input_ref(row):
            for lo, hi in _sequences(row, len(row["input_ids"]) // 4) or ():
                wanted.add(_last_call(row, lo, hi) or "")
        if not is_logprobs_ref(row):
            wanted |= {c for c, source, *_ in _segments(row) if source == "OUTPUT"}
        return {c for c in wanted if c and c not in self.calls}

    def _input_refs(self, row: Row, ids: bytes, tokens: int) -> list[str] | None:
        view = memoryview(ids)
        refs = []
        for lo, hi in _sequences(row, tokens) or ():
            call_id = _last_call(row, lo, hi)
            d = self._digest(call_id)
            if d is None or hi - lo != d.prompt_tokens + d.output_tokens:
                return None
            cut = lo + d.prompt_tokens
            if _sha(view[lo * 4 : cut * 4]).hex() != d.prompt_sha256 or _sha(view[cut * 4 : hi * 4]) != d.output_sha256:
                return None
            refs.append(call_id)  # type: ignore[arg-type]  # a digest was found, so not None
        return refs or None

    def _logprobs_derivable(self, row: Row, tokens: int) -> bool:
        data: bytes = row["rollout_logprobs"]
        if len(data) != tokens * 4:
            return False
        outside = np.ones(tokens, dtype=bool)
        view = memoryview(data)
        for call_id, source, start, call_start, length in _segments(row):
            if source != "OUTPUT":
                continue
            d = self._digest(call_id)
            if d is None or call_start != 0 or length != d.output_tokens:
                return False
            if _sha(view[start * 4 : (start + length) * 4]) != d.logprobs_sha256:
                return False
            outside[start : start + length] = False
        words = np.frombuffer(data, dtype=np.uint32)[outside]
        return bool((words == np.frombuffer(NAN_BYTES, dtype=np.uint32)[0]).all())


def _segments(row: Row) -> list[tuple[str, str, int, int, int]]:
    return list(
        zip(
            row["seg_call_id"],
            row["seg_source"],
            (int(s) for s in row["seg_sample_start"]),
            (int(s) for s in row["seg_call_start"]),
            (int(s) for s in row["seg_length"]),
            strict=True,
        )
    )


CallTokensOf = Callable[[str], CallTokens]


def _call(sample_id: str, call_id: str, call_tokens: CallTokensOf) -> CallTokens:
    try:
        return call_tokens(call_id)
    except Exception as exc:  # missing call, broken delta chain: the sample cannot be rebuilt
        raise SampleRefError(f"sample {sample_id}: referenced call {call_id}: {exc}") from None


def rebuild_sample(row: Row, call_tokens: CallTokensOf) -> None:
    """Replace referenced token columns of a samples row by the full bytes, in place, checked.

    ``call_tokens(call_id)`` gives a call's full prompt and its output bytes (raising if unknown).
    Raises SampleRefError naming the sample when a call is missing or a rebuilt column does not
    match its recorded length and sha256.
    """
    sample_id = row["event_id"]
    tokens = int(row["input_length"])
    if is_input_ref(row) and "input_ids" in row:
        parts = []
        for call_id in row["input_ref_call_ids"]:
            call = _call(sample_id, call_id, call_tokens)
            parts += [call.prompt.tobytes(), call.output_ids]
        row["input_ids"] = _checked(sample_id, "input_ids", b"".join(parts), tokens, row["input_sha256"])
        row["input_ref_call_ids"], row["input_sha256"] = [], ""
    if is_logprobs_ref(row) and "rollout_logprobs" in row:
        out = bytearray(NAN_BYTES * tokens)
        for call_id, source, start, call_start, length in _segments(row):
            if source != "OUTPUT":
                continue
            if start + length > tokens:
                raise SampleRefError(f"sample {sample_id}: OUTPUT segment at {start} runs past its {tokens} tokens")
            logprobs = _call(sample_id, call_id, call_tokens).output_logprobs
            piece = logprobs[call_start * 4 : (call_start + length) * 4]
            if len(piece) != length * 4:
                raise SampleRefError(f"sample {sample_id}: call {call_id} has no logprobs at {call_start}+{length}")
            out[start * 4 : (start + length) * 4] = piece
        row["rollout_logprobs"] = _checked(sample_id, "rollout_logprobs", bytes(out), tokens, row["logprobs_sha256"])
        row["logprobs_sha256"] = ""


def _checked(sample_id: str, column: str, data: bytes, tokens: int, sha256: str) -> bytes:
    if len(data) != tokens * 4:
        raise SampleRefError(f"sample {sample_id}: rebuilt {column} has {len(data) // 4} tokens, the row says {tokens}")
    if _sha(data).hex() != sha256:
        raise SampleRefError(f"sample {sample_id}: rebuilt {column} does not match its recorded sha256")
    return data
