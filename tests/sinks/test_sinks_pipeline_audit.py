"""The audit on the real processors core's output (assembler -> grouper -> process_group), under
split, merged and packed sample configurations, and replayed configurations side by side."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from clickhouse_connect.driver.client import Client

from processors.assembler import RolloutAssembly
from processors.grouper import GrouperState, GroupingConfig
from processors.pipeline import StageConfigs, process_group, rederive
from processors.samples import SampleConfig
from processors.testing import AttemptSpec, attempt_events, growing_turns
from processors.verifiers import VerifierRunner, load_verifiers
from schemas.tokens import pack_floats, unpack_floats
from sinks.audit import run_audit
from sinks.store import load_records, load_rollouts, write_records
from sinks.synthetic import Event

CONFIGS = StageConfigs.load(
    "deploy/config/reward.yaml", "deploy/config/credit.yaml", "deploy/config/sample.yaml"
)
VERIFIERS = load_verifiers(["processors.verifiers.answer_match:AnswerMatch"])
RUNNER = VerifierRunner(timer=lambda: 0.0)
ANSWERS = ["The answer is 4", "The answer is 5", "The answer is 4", "I don't know"]


def sample_config(merge: bool, pack: bool) -> SampleConfig:
    return SampleConfig.model_validate(
        {**CONFIGS.sample.model_dump(), "merge": merge, "pack": {"enabled": pack, "max_tokens": 4096}}
    )


def pipeline_events(seed: int, sample_cfg: SampleConfig) -> tuple[list[Event], dict, list[dict]]:
    """Inputs, rollouts, the group and everything derived, as the processors emit them."""
    rng = np.random.default_rng(seed)
    inputs: list[Event] = []
    for k, answer in enumerate(ANSWERS):
        turns = growing_turns(rng, 3, 40, 8, 10, vocab=800, texts=["calling a tool", "thinking", answer])
        inputs += attempt_events(
            AttemptSpec(
                f"s{seed}-r{k}",
                "a1",
                turns,
                env_events=2,
                task_input={"answer": "4", "seed": seed},
                group_key={"task": "add"},
                expected_group_size=4,
                t0_us=1_700_000_000_000_000 + k * 1000,
            )
        )
    states: dict[str, RolloutAssembly] = {}
    grouper = GrouperState()
    rollouts: dict[str, dict] = {}
    groups: list[dict] = []
    for name, rec in inputs:
        state = states.setdefault(rec["rollout_id"], RolloutAssembly(rec["rollout_id"]))
        for rollout in state.accept(name, rec).rollouts:
            rollouts[rollout["event_id"]] = rollout
            groups += [e.group for e in grouper.add(rollout, GroupingConfig()).emitted]
    (group,) = groups
    members = [rollouts[e] for e in group["rollout_event_ids"]]
    derived = process_group(
        group, members, VERIFIERS, CONFIGS.reward, CONFIGS.credit, sample_cfg, runner=RUNNER
    )
    events = inputs + [("CompletedRollout", r) for r in rollouts.values()] + [("RolloutGroup", group)]
    return events + derived.events(), group, members


@pytest.mark.parametrize(("merge", "pack"), [(False, False), (True, False), (True, True)])
def test_audit_passes_on_pipeline_output(ch: Client, merge: bool, pack: bool) -> None:
    events, _group, _members = pipeline_events(1, sample_config(merge, pack))
    write_records(ch, events)
    results = run_audit(ch)
    assert all(r.passed for r in results), {r.key: r.failures[:3] for r in results if not r.passed}
    kinds = {s["kind"] for n, s in events if n == "Sample"}
    assert kinds == ({"PACKED"} if pack else {"MERGED"} if merge else {"CALL"})
    assert {r.key: r.checked > 0 for r in results} == dict.fromkeys((r.key for r in results), True)


def test_stored_rollouts_and_scores_rederive_identically(ch: Client) -> None:
    """What replay needs: rollouts and scores read back from ClickHouse give the same derivations."""
    events, group, members = pipeline_events(2, CONFIGS.sample)
    write_records(ch, events)
    stored_rollouts = {r["event_id"]: r for r in load_rollouts(ch)}
    assert all(stored_rollouts[m["event_id"]] == m for m in members)
    stored_scores = load_records(ch, "scores")
    (stored_group,) = load_records(ch, "groups")
    assert stored_group == group
    again = rederive(
        stored_group,
        [stored_rollouts[e] for e in group["rollout_event_ids"]],
        stored_scores,
        CONFIGS.reward,
        CONFIGS.credit,
        sample_config(True, True),
    )
    write_records(ch, again.events())  # a second sample configuration next to the first
    assert len({s["sample_config_id"] for s in load_records(ch, "samples")}) == 2
    assert all(r.passed for r in run_audit(ch))


def test_pipeline_output_with_a_reweighted_packed_sample_fails(ch: Client) -> None:
    events, _group, _members = pipeline_events(3, sample_config(True, True))
    samples = [r for n, r in events if n == "Sample"]
    target = copy.deepcopy(samples[0])
    weights = unpack_floats(target["weights"]).copy()
    weights *= 1.5
    target["weights"] = pack_floats(weights)
    events = [
        (n, target if (n == "Sample" and r["event_id"] == target["event_id"]) else r) for n, r in events
    ]
    write_records(ch, events)
    (packing,) = run_audit(ch, only=["packing_preserves_weight"])
    assert not packing.passed
    credits = {
        r["event_id"]
        for n, r in events
        if n == "Credit" and r["rollout_id"] in target["rollout_ids"] and r["rollout_weight"] > 0
    }
    assert set(packing.failing_ids()) == credits
