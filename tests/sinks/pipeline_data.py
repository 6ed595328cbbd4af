"""Events as the real processors core emits them (assembler -> grouper -> process_group)."""

from __future__ import annotations

import numpy as np

from processors.assembler import RolloutAssembly
from processors.grouper import GrouperState, GroupingConfig
from processors.isolation.calls import verifier_runner
from processors.pipeline import StageConfigs, process_group
from processors.samples import SampleConfig
from processors.verifiers import load_verifiers
from testkit.stages import AttemptSpec, attempt_events, growing_turns
from testkit.storage_records import Event

CONFIGS = StageConfigs.load("deploy/config/reward.yaml", "deploy/config/credit.yaml", "deploy/config/sample.yaml")
VERIFIERS = load_verifiers(["processors.verifiers.answer_match:AnswerMatch"])
RUNNER = verifier_runner(timer=lambda: 0.0)
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
    derived = process_group(group, members, VERIFIERS, CONFIGS.reward, CONFIGS.credit, sample_cfg, runner=RUNNER)
    events = inputs + [("CompletedRollout", r) for r in rollouts.values()] + [("RolloutGroup", group)]
    return events + derived.events(), group, members
