"""vLLM's weight labels and the spans of output tokens each label sampled, as policy versions.

vLLM labels the weights a server runs with a string (``POST /update_weight_version``; ``default`` for the
weights it started with), and ``/inference/v1/generate`` reports per finished choice which label sampled
which output tokens (``weight_versions``: ``{version, start, end}``). These are ``WeightLabelSpan``s: a
vLLM string label, not yet a policy version. ``label_version`` reads a label as a policy version, and
``policy_spans`` turns the spans into the contract's typed ``PolicySpan``s (the Avro ``VersionSpan``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from producers.upstreams.vllm.errors import bad_answer
from schemas.version_spans import PolicySpan

# vLLM's label for the weights a server started with: the base model, policy version 0.
BASE_WEIGHT_LABEL = "default"


@dataclass(frozen=True)
class WeightLabelSpan:
    """Output tokens ``[start, end)`` were sampled by the weights vLLM labelled ``version`` (vLLM's field
    name; a label string such as ``"3"`` or ``"default"``, read as a policy version by ``label_version``)."""

    version: str
    start: int
    end: int


def label_version(label: str) -> int | None:
    """A weight label as a policy version: ``default`` is the base model (0); a foreign label is None."""
    if label == BASE_WEIGHT_LABEL:
        return 0
    return int(label) if label.isdigit() else None


def parse_spans(raw: object, n_tokens: int, server: str) -> list[WeightLabelSpan]:
    """vLLM's ``weight_versions`` of a finished choice, checked to cover the output tokens exactly."""
    if not isinstance(raw, list) or (n_tokens and not raw):
        raise bad_answer(server, f"reported no weight_versions for {n_tokens} tokens")
    spans = [WeightLabelSpan(str(s["version"]), int(s["start"]), int(s["end"])) for s in raw]
    cursor = 0
    for span in spans:
        if span.start != cursor or span.end <= span.start:
            raise bad_answer(server, f"sent weight_versions that do not tile the output: {raw}")
        cursor = span.end
    if cursor != n_tokens:
        raise bad_answer(server, f"sent weight_versions over {cursor} tokens for {n_tokens}")
    return spans


def spans_text(spans: Sequence[WeightLabelSpan]) -> str:
    """The spans as the compact text kept in a call's engine details: ``1:0-4,2:4-400``."""
    return ",".join(f"{s.version}:{s.start}-{s.end}" for s in spans)


def spans_from_text(text: str) -> list[WeightLabelSpan]:
    """Inverse of ``spans_text``."""
    spans = []
    for part in filter(None, text.split(",")):
        label, _, bounds = part.rpartition(":")
        start, _, end = bounds.partition("-")
        spans.append(WeightLabelSpan(label, int(start), int(end)))
    return spans


def spans_version(spans: Sequence[WeightLabelSpan], fallback: int) -> int:
    """The policy version a call records: that of its first sampled token (the oldest weights, so its
    staleness is never understated); ``fallback`` when no token was sampled or the label is foreign."""
    version = label_version(spans[0].version) if spans else None
    return fallback if version is None else version


def policy_spans(spans: Sequence[WeightLabelSpan], policy_version: int) -> tuple[PolicySpan, ...]:
    """The spans as typed policy versions for the call record, only where they say more than
    ``policy_version`` (a weight update landed mid-call); none when a label is foreign (not a version)."""
    versions = [label_version(s.version) for s in spans]
    if all(v == policy_version for v in versions) or any(v is None for v in versions):
        return ()
    return tuple(PolicySpan(v, s.start, s.end) for v, s in zip(versions, spans, strict=True) if v is not None)
