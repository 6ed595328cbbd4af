"""The whole core: events -> assembler -> grouper -> process_group / rederive, and dead letters."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from processors.assembler import RolloutAssembly
from processors.dead_letters import dead_letter
from processors.errors import PipelineInputError
from processors.grouper import GrouperState, GroupingConfig
from processors.isolation.calls import verifier_runner
from processors.pipeline import StageConfigs, order_rollouts, process_group, rederive
from processors.samples import SampleConfig, weight_by_rollout
from processors.verifiers import load_verifiers
from schemas.codec import CorruptRecord, get_codec
from testkit.stages import AttemptSpec, attempt_events, full_group, growing_turns

CONFIGS = StageConfigs.load("deploy/config/reward.yaml", "deploy/config/credit.yaml",
                            "deploy/config/sample.yaml")
VERIFIERS = load_verifiers(["processors.verifiers.answer_match:AnswerMatch",
                            "processors.verifiers.group_rank:GroupRank"])
RUNNER = verifier_runner(timer=lambda: 0.0)
ANSWERS = ["The answer is 4", "The answer is 5", "The answer is 4", "I don't know"]


def events_for_group(seed: int = 0, shuffle: bool = False) -> list[tuple[str, dict]]:
    rng = np.random.default_rng(seed)
    events = []
    for k, answer in enumerate(ANSWERS):
        turns = growing_turns(rng, 3, 30, 6, 8, vocab=800, texts=["calling a tool", "thinking", answer])
        events += attempt_events(AttemptSpec(f"r{k}", "a1", turns, env_events=2, task_input={"answer": "4"},
                                             group_key={"task": "add"}, expected_group_size=4,
                                             t0_us=1_700_000_000_000_000 + k * 1000))
    if shuffle:
        random.Random(seed).shuffle(events)
    return events


def run_core(events: list[tuple[str, dict]]) -> tuple[dict, list[dict], object]:
    states: dict[str, RolloutAssembly] = {}
    grouper, cfg = GrouperState(), GroupingConfig()
    rollouts, groups = {}, []
    for name, rec in events:
        state = states.setdefault(rec["rollout_id"], RolloutAssembly(rec["rollout_id"]))
        for rollout in state.accept(name, rec).rollouts:
            rollouts[rollout["event_id"]] = rollout
            groups += [e.group for e in grouper.add(rollout, cfg).emitted]
    (group,) = groups
    members = [rollouts[e] for e in group["rollout_event_ids"]]
    derived = process_group(group, members, VERIFIERS, CONFIGS.reward, CONFIGS.credit, CONFIGS.sample,
                            runner=RUNNER)
    return group, members, derived


def test_end_to_end_core_outputs_are_valid_and_linked() -> None:
    group, rollouts, derived = run_core(events_for_group())
    codec = get_codec()
    records = [("RolloutGroup", group), *[("CompletedRollout", r) for r in rollouts], *derived.events()]
    for name, record in records:
        codec.decode(codec.encode(name, record), expect=name)
    assert group["status"] == "FULL" and len(rollouts) == 4
    assert len(derived.scores) == 8  # answer_match and group_rank for each rollout
    rewards = {r["rollout_id"]: r for r in derived.rewards}
    assert [rewards[f"r{k}"]["raw_reward"] for k in range(4)] == [1.0, 0.0, 1.0, 0.0]
    assert rewards["r0"]["reward"] > 0 > rewards["r1"]["reward"]
    assert all(r["reward_config_id"] == CONFIGS.reward.id for r in derived.rewards)
    score_ids = {s["event_id"] for s in derived.scores}
    assert all(set(r["score_ids"]) <= score_ids for r in derived.rewards)
    assert {c["reward_id"] for c in derived.credits} == {r["event_id"] for r in derived.rewards}
    assert len(derived.samples) == 12  # 4 rollouts x 3 calls, split per call
    credit_ids = {c["event_id"] for c in derived.credits}
    totals: dict[str, float] = {}
    for s in derived.samples:
        assert set(s["credit_ids"]) <= credit_ids and s["sample_config_id"] == CONFIGS.sample.id
        for rid, w in weight_by_rollout(s).items():
            totals[rid] = totals.get(rid, 0.0) + w
    assert totals == pytest.approx({f"r{k}": 1.0 for k in range(4)})


def test_same_input_twice_gives_identical_records_and_ids_in_any_arrival_order() -> None:
    first = run_core(events_for_group())
    again = run_core(events_for_group())
    shuffled = run_core(events_for_group(shuffle=True))
    assert first[0] == again[0] == shuffled[0]
    assert first[1] == again[1] == shuffled[1]
    assert first[2] == again[2] == shuffled[2]
    codec = get_codec()
    encoded = [[codec.encode(name, rec) for name, rec in run[2].events()] for run in (first, shuffled)]
    assert encoded[0] == encoded[1]  # byte-identical events, ids included


def test_rederive_from_stored_scores_matches_and_new_configs_get_new_ids() -> None:
    group, rollouts, derived = run_core(events_for_group())
    stored_scores = copy.deepcopy(derived.scores)
    redelivered = rederive(group, rollouts, stored_scores + stored_scores[:3], CONFIGS.reward, CONFIGS.credit,
                           CONFIGS.sample)
    assert redelivered.scores == derived.scores and redelivered.rewards == derived.rewards
    replay = rederive(group, list(reversed(rollouts)), stored_scores, CONFIGS.reward, CONFIGS.credit,
                      CONFIGS.sample)
    assert replay.rewards == derived.rewards and replay.credits == derived.credits
    assert replay.samples == derived.samples
    assert stored_scores == derived.scores  # raw scores untouched
    merged_cfg = SampleConfig(merge=True)
    rloo = CONFIGS.reward.model_copy(update={"normalize": CONFIGS.reward.normalize.model_copy(
        update={"method": "rloo"})})
    changed = rederive(group, rollouts, stored_scores, rloo, CONFIGS.credit, merged_cfg)
    assert {r["reward_config_id"] for r in changed.rewards} == {rloo.id} != {CONFIGS.reward.id}
    assert not {r["event_id"] for r in changed.rewards} & {r["event_id"] for r in derived.rewards}
    assert [s["kind"] for s in changed.samples] == ["MERGED"] * 4


def test_late_groups_are_scored_but_never_trained_on() -> None:
    _, rollouts, _ = run_core(events_for_group())
    late = full_group(rollouts[:1], status="LATE")
    derived = process_group(late, rollouts[:1], VERIFIERS, CONFIGS.reward, CONFIGS.credit, CONFIGS.sample,
                            runner=RUNNER)
    assert [s["verifier_name"] for s in derived.scores] == ["answer_match"]
    assert derived.rewards[0]["filtered"] and derived.rewards[0]["filter_reason"].startswith("late")
    assert derived.credits == [] and derived.samples == []


def test_inputs_that_do_not_belong_together_are_rejected() -> None:
    group, rollouts, _ = run_core(events_for_group())
    with pytest.raises(PipelineInputError, match="missing"):
        order_rollouts(group, rollouts[:2])
    incomplete = dict(rollouts[0], status="INCOMPLETE")
    with pytest.raises(PipelineInputError, match="only complete rollouts"):
        order_rollouts(group, [incomplete, *rollouts[1:]])


def test_dead_letters_carry_the_reason_and_a_stable_id() -> None:
    codec = get_codec()
    with pytest.raises(CorruptRecord) as info:
        codec.decode(b"garbage!!", topic="tokentrail.calls", partition=2, offset=17)
    record = dead_letter(stage="assembler", source_topic="tokentrail.calls", partition=2, offset=17,
                         key=b"r1", value=b"garbage!!", error=info.value, created_at_us=123)
    assert record["error_type"] == "CorruptRecord" and "unknown framing" in record["reason"]
    assert record == dead_letter(stage="assembler", source_topic="tokentrail.calls", partition=2, offset=17,
                                 key=b"r1", value=b"garbage!!", error=info.value, created_at_us=123)
    codec.encode("DeadLetter", record)
    plain = dead_letter(stage="grouper", source_topic="t", partition=0, offset=1, key=None, value=None,
                        error="no group", created_at_us=1)
    assert plain["error_type"] == "Error" and plain["value"] == b""
