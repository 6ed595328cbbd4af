"""Per-token policy versions end to end (issue 19 item 3): a call whose tokens span a weight update
(vLLM's ``weight_versions``: the first tokens at version 3, the rest at 4) -> the gateway's call record
(typed ``version_spans``) -> the assembled rollout -> the sample -> the trainer, whose ``mask`` rule takes
the weight off exactly the tokens of the stale version. Every record goes through the real Avro codec;
records written before the fields existed read as their defaults."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from processors.assembler import RolloutAssembly
from processors.credit import CreditConfig, compute_credits
from processors.errors import PipelineInputError
from processors.rewards import RewardConfig, compute_rewards
from processors.samples import SampleConfig, build_samples
from producers.gateway import records
from producers.upstreams.base import ReleaseAssignment
from producers.upstreams.vllm.labels import parse_spans, policy_spans, spans_version
from schemas.builders import T0_US, make_finished, make_started
from schemas.codec import SCHEMA_DIR, Codec, SchemaStore, get_codec
from schemas.examples import example_record
from schemas.ids import call_id
from schemas.prompt_delta import full_prompt
from schemas.tokens import unpack_floats, unpack_mask
from testkit.stages import constant_scores, full_group
from trainer_consumer.sample_view import check_sample, sample_from_record
from trainer_consumer.staleness import StalenessBound, token_versions

Record = dict
REWARD = RewardConfig(metrics=[{"name": "m", "verifier": "v"}], normalize={"method": "none"},
                      filters={"zero_variance": False})
CREDIT = CreditConfig()
RID, AID = "r-span", "r-span-a1"
PROMPT = list(range(100, 108))  # 8 prompt tokens
OUTPUT = list(range(200, 210))  # 10 sampled tokens: 4 before the update, 6 after


def round_trip(name: str, record: Record) -> Record:
    codec = get_codec()
    decoded_name, decoded = codec.decode(codec.encode(name, record), expect=name)
    assert decoded_name == name
    return decoded


def gateway_record(index: int, prompt: list[int], output: list[int], weight_versions: list[dict],
                   release: ReleaseAssignment | None = None) -> Record:
    """The call record the gateway writes for a vLLM answer carrying these ``weight_versions``."""
    spans = parse_spans(weight_versions, len(output), "s")
    version = spans_version(spans, fallback=-1)
    versions = records.Versions(model="m", policy_version=version, tokenizer_fingerprint="tok",
                                chat_template_fingerprint="tpl", adapter_version="a", parser_version="p",
                                engine="vllm/0.32.0", upstream="s")
    return records.call_record(
        call_id=call_id(RID, AID, index), rollout_id=RID, attempt_id=AID, call_index=index, session_id=None,
        protocol="openai.chat", streamed=True, error=None, prompt=full_prompt(prompt), output_ids=output,
        output_logprobs=[-0.5] * len(output), logprob_kind="RAW", finish_reason="stop", versions=versions,
        sampling=records.sampling_record(temperature=1.0, top_p=1.0, top_k=0, max_tokens=64, seed=None,
                                         stop=[], extra={}),
        prefix_mode="splice", spliced_outputs=0, prefix_breaks=[], received_at_us=T0_US + 1000 * (index + 1),
        queue_ms=0.0, first_token_ms=1.0, total_ms=2.0, request="{}", response="{}",
        version_spans=policy_spans(spans, version), release=release)


def rollout_of(calls: list[Record]) -> Record:
    state = RolloutAssembly(RID)
    events = [("AttemptStarted", make_started(RID, AID)), *(("CallRecord", c) for c in calls),
              ("AttemptFinished", make_finished(RID, AID, len(calls), 0, created_at_us=T0_US + 10_000))]
    emitted = [r for name, rec in events for r in state.accept(name, round_trip(name, rec)).rollouts]
    assert len(emitted) == 1
    return round_trip("CompletedRollout", emitted[0])


def samples_of(rollout: Record, cfg: SampleConfig) -> list[Record]:
    group = full_group([rollout])
    rewards = compute_rewards(group, [rollout], constant_scores(group, [rollout], [1.0]), REWARD)
    credits = compute_credits([rollout], rewards, CREDIT)
    return [round_trip("Sample", s) for s in build_samples(group, [rollout], rewards, credits, CREDIT, cfg)]


ACROSS_3_TO_4 = [{"version": "3", "start": 0, "end": 4}, {"version": "4", "start": 4, "end": 10}]


def test_a_call_across_a_weight_update_masks_exactly_its_stale_tokens() -> None:
    release = ReleaseAssignment("rel-1", 7, "candidate")
    record = round_trip("CallRecord", gateway_record(0, PROMPT, OUTPUT, ACROSS_3_TO_4, release))
    assert record["versions"]["policy_version"] == 3  # the first token's version: staleness never understated
    assert record["version_spans"] == [{"version": 3, "start": 0, "end": 4}, {"version": 4, "start": 4, "end": 10}]
    assert record["release"] == {"release_id": "rel-1", "decision_sequence": 7, "arm": "candidate",
                                 "pin_label": None}

    rollout = rollout_of([record])
    assert rollout["calls"][0]["version_spans"] == record["version_spans"]
    assert rollout["policy_versions"] == [3, 4]

    [sample] = samples_of(rollout, SampleConfig())
    n_prompt = len(PROMPT)
    assert (sample["policy_version_first"], sample["policy_version_last"]) == (3, 4)
    assert sample["version_spans"] == [{"version": 3, "start": n_prompt, "end": n_prompt + 4},
                                       {"version": 4, "start": n_prompt + 4, "end": n_prompt + 10}]

    train = sample_from_record(sample)
    assert check_sample(train) is None
    assert token_versions(train).tolist() == [3] * (n_prompt + 4) + [4] * 6
    weights = unpack_floats(sample["weights"])
    # At version 5 with max_staleness 1, version 3 is stale and version 4 is not.
    masked = StalenessBound(1, "mask").apply(train, current_version=5)
    assert masked.sample is not None and (masked.stale_tokens, masked.masked_tokens) == (4, 4)
    stale = np.zeros(train.num_tokens, dtype=bool)
    stale[n_prompt:n_prompt + 4] = True
    assert (masked.sample.weights[stale] == 0).all()
    assert np.array_equal(masked.sample.weights[~stale], weights[~stale])  # the version-4 tokens keep theirs
    assert np.count_nonzero(masked.sample.weights) == 6
    assert StalenessBound(1, "drop").apply(train, current_version=5).sample is None
    # One version later both are stale: nothing is left to train on.
    assert StalenessBound(1, "mask").apply(train, current_version=6).sample is None
    # Spans outside the sample are a malformed sample, filtered with the reason, never a crash.
    bad = dataclasses.replace(train, version_spans=((4, n_prompt, train.num_tokens + 1),))
    assert check_sample(bad) == "malformed:version_spans"


def test_one_version_per_call_keeps_records_small_and_merged_samples_exact() -> None:
    first = gateway_record(0, PROMPT, OUTPUT[:4], [{"version": "3", "start": 0, "end": 4}])
    tool = [300, 301]
    second_prompt = PROMPT + OUTPUT[:4] + tool
    second = gateway_record(1, second_prompt, OUTPUT[4:], [{"version": "4", "start": 0, "end": 6}])
    assert first["version_spans"] == [] and second["version_spans"] == []  # the record's version says it all
    rollout = rollout_of([first, second])
    assert rollout["policy_versions"] == [3, 4]

    split = samples_of(rollout, SampleConfig())
    assert [s["version_spans"] for s in split] == [[], []]  # one version per sample: no spans
    [merged] = samples_of(rollout, SampleConfig(merge=True))
    n = len(PROMPT)
    second_start = len(second_prompt)
    assert merged["kind"] == "MERGED"
    assert merged["version_spans"] == [{"version": 3, "start": n, "end": n + 4},
                                       {"version": 4, "start": second_start, "end": second_start + 6}]
    train = sample_from_record(merged)
    mask = unpack_mask(merged["loss_mask"])
    versions = token_versions(train)
    assert versions[mask != 0].tolist() == [3] * 4 + [4] * 6
    # Before per-token versions the whole merged sample counted as version 3; now only the first output is stale.
    masked = StalenessBound(1, "mask").apply(train, current_version=5)
    assert masked.sample is not None and masked.masked_tokens == 4


def test_spans_that_do_not_tile_a_calls_output_are_refused_by_the_sample_builder() -> None:
    record = gateway_record(0, PROMPT, OUTPUT, ACROSS_3_TO_4)
    record["version_spans"] = [{"version": 3, "start": 0, "end": 4}, {"version": 4, "start": 5, "end": 10}]
    with pytest.raises(PipelineInputError, match="do not tile"):
        samples_of(rollout_of([record]), SampleConfig())


def new_fields(name: str, record: Record) -> object:
    if name == "CompletedRollout":
        return [c["version_spans"] for c in record["calls"]]
    if name == "CallRecord":
        return record["version_spans"], record["release"]
    return record["version_spans"]


@pytest.mark.parametrize(("name", "history", "defaults"), [
    ("CallRecord", "call_record.v2.avsc", ([], None)),
    ("CompletedRollout", "completed_rollout.v3.avsc", [[]]),  # the example has one call
    ("Sample", "sample.v1.avsc", []),
])
def test_records_written_before_the_fields_read_as_their_defaults(
    tmp_path: Path, name: str, history: str, defaults: object,
) -> None:
    """Written with the previous schema version (as data already on Kafka was), read with the current one."""
    (tmp_path / "history").mkdir()
    shutil.copy(SCHEMA_DIR / "history" / history, tmp_path / history)  # the old version as the writer's current
    old_schema = json.loads((tmp_path / history).read_text())
    data = Codec(SchemaStore(tmp_path)).encode(name, example_record(old_schema))
    _, record = get_codec().decode(data, expect=name)
    assert new_fields(name, record) == defaults
