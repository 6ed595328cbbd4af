"""vLLM's per-token ``weight_versions`` spans (``/inference/v1/generate``): checked to tile the output,
kept as text in a call's engine details, and turned into the call's policy version. The spans' shape is
vLLM 0.32's (``vllm/outputs.py`` WeightVersionSpan: version, start, end); the live test
tests/producers/upstreams/vllm_live/test_engine_versions_live.py reads them from the real server."""

from __future__ import annotations

import pytest

from producers.upstreams.base import UpstreamError
from producers.upstreams.vllm.labels import (
    WeightLabelSpan,
    label_version,
    parse_spans,
    policy_spans,
    spans_from_text,
    spans_text,
    spans_version,
)

# What the real server answered in docs/weight-sync.md's probe (a request in flight across an update).
ACROSS_AN_UPDATE = [{"version": "1", "start": 0, "end": 4}, {"version": "2", "start": 4, "end": 400}]


def test_spans_over_the_whole_output_are_read_and_kept_as_text() -> None:
    spans = parse_spans(ACROSS_AN_UPDATE, 400, "s")
    assert spans == [WeightLabelSpan("1", 0, 4), WeightLabelSpan("2", 4, 400)]
    assert spans_text(spans) == "1:0-4,2:4-400"
    assert spans_from_text(spans_text(spans)) == spans
    assert spans_from_text("") == []


@pytest.mark.parametrize("raw, n_tokens", [
    (None, 3),  # no report at all
    ([], 3),  # no span for sampled tokens
    ([{"version": "1", "start": 0, "end": 2}], 3),  # short of the output
    ([{"version": "1", "start": 1, "end": 3}], 3),  # does not start at the first token
    ([{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 1, "end": 3}], 3),  # overlap
])
def test_spans_that_do_not_tile_the_output_are_refused(raw: object, n_tokens: int) -> None:
    with pytest.raises(UpstreamError) as caught:
        parse_spans(raw, n_tokens, "s")
    assert caught.value.status_code == 502


def test_a_call_records_the_version_of_its_first_token_and_foreign_labels_fall_back() -> None:
    assert (label_version("default"), label_version("12"), label_version("incomplete-3")) == (0, 12, None)
    assert spans_version([WeightLabelSpan("3", 0, 2), WeightLabelSpan("4", 2, 5)], fallback=9) == 3
    assert spans_version([WeightLabelSpan("default", 0, 5)], fallback=9) == 0
    assert spans_version([WeightLabelSpan("incomplete-3", 0, 5)], fallback=9) == 9
    assert spans_version([], fallback=9) == 9  # no token sampled


def test_spans_go_typed_into_the_result_only_when_they_name_more_than_the_calls_version() -> None:
    spans = parse_spans(ACROSS_AN_UPDATE, 400, "s")
    typed = policy_spans(spans, spans_version(spans, fallback=9))
    assert [(s.version, s.start, s.end) for s in typed] == [(1, 0, 4), (2, 4, 400)]
    assert policy_spans([WeightLabelSpan("3", 0, 5)], 3) == ()  # one version: the record's policy_version says it
    assert policy_spans([WeightLabelSpan("default", 0, 2), WeightLabelSpan("1", 2, 5)], 0)[0].version == 0
    assert policy_spans([WeightLabelSpan("incomplete-3", 0, 2), WeightLabelSpan("4", 2, 5)], 9) == ()  # foreign label
