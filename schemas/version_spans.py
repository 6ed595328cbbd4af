"""Typed policy-version spans: which policy version sampled which tokens (the Avro ``VersionSpan``).

A weight update can land while a call is generating (vLLM's ``weight_versions``): the first output
tokens then come from one version and the rest from the next. ``CallRecord.version_spans`` and
``CompletedRollout.calls[].version_spans`` hold such spans over the call's output token indices;
``Sample.version_spans`` holds them over the sample's token positions. An empty list is the common case
and means "one version for all of them" (the call's ``policy_version``, the sample's
``policy_version_first``), so records stay small.

Pure: plain dicts in the Avro shape ``{"version", "start", "end"}`` (``end`` exclusive) and numpy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

SpanRecord = dict[str, int]


@dataclass(frozen=True)
class PolicySpan:
    """Tokens ``[start, end)`` were sampled by the weights of policy version ``version``."""

    version: int
    start: int
    end: int

    def as_record(self) -> SpanRecord:
        return {"version": int(self.version), "start": int(self.start), "end": int(self.end)}


class VersionSpanError(ValueError):
    """Spans that do not describe the tokens they claim to (gaps, overlaps, out of range)."""


def check_tiling(spans: Sequence[SpanRecord], n_tokens: int) -> None:
    """Spans that are set must tile ``[0, n_tokens)`` in order, each non-empty; empty spans are fine."""
    if not spans:
        return
    cursor = 0
    for span in spans:
        if span["start"] != cursor or span["end"] <= span["start"]:
            raise VersionSpanError(f"version spans do not tile the tokens: {list(spans)}")
        cursor = span["end"]
    if cursor != n_tokens:
        raise VersionSpanError(f"version spans cover {cursor} tokens, not {n_tokens}")


def call_spans(spans: Sequence[PolicySpan], policy_version: int, n_output: int) -> list[SpanRecord]:
    """What a call record keeps of an upstream's spans over ``n_output`` recorded output tokens: nothing
    when every one came from ``policy_version`` (the record's version says it all), else the spans.

    Spans reaching past the recorded output are cut at its end (the gateway recorded fewer tokens than
    the engine reported); spans that leave recorded tokens uncovered are an error."""
    records = [{**s.as_record(), "end": min(s.end, n_output)} for s in spans if s.start < n_output]
    if all(r["version"] == policy_version for r in records):
        return []
    check_tiling(records, n_output)
    return merge_adjacent(records)


def call_versions_of(call: Any) -> list[SpanRecord]:
    """A call's (``CallRecord`` or ``CompletedRollout.calls[]``) spans over its output, never empty
    unless the output is: the stored spans, or one span of its ``policy_version``."""
    spans = call.get("version_spans") or []
    if spans:
        return [dict(s) for s in spans]
    n_output = len(call["output_ids"]) // 4  # packed uint32
    version = int(call["policy_version"] if "policy_version" in call else call["versions"]["policy_version"])
    return [{"version": version, "start": 0, "end": n_output}] if n_output else []


def shifted(spans: Iterable[SpanRecord], offset: int) -> list[SpanRecord]:
    return [{"version": s["version"], "start": s["start"] + offset, "end": s["end"] + offset} for s in spans]


def merge_adjacent(spans: Iterable[SpanRecord]) -> list[SpanRecord]:
    """Neighbouring spans of one version that touch become one."""
    out: list[SpanRecord] = []
    for s in spans:
        if out and out[-1]["version"] == s["version"] and out[-1]["end"] == s["start"]:
            out[-1] = {**out[-1], "end": s["end"]}
        else:
            out.append(dict(s))
    return out


def per_token(spans: Sequence[SpanRecord], n_tokens: int, default: int) -> npt.NDArray[np.int64]:
    """One version per token: ``default`` outside every span."""
    versions = np.full(n_tokens, default, dtype=np.int64)
    for s in spans:
        if not 0 <= s["start"] < s["end"] <= n_tokens:
            raise VersionSpanError(f"version span {s} outside {n_tokens} tokens")
        versions[s["start"]:s["end"]] = s["version"]
    return versions
