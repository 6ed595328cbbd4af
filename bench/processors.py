"""Stage-core benchmark: sample tokens produced per second per core, and state per in-flight rollout.

Workload: groups of multi-turn rollouts, 16 calls each, the context growing to ~32k tokens (every
prompt extends the previous prompt ‖ output with a tool result), prompts delta-encoded as the gateway
records them. Timed, single-threaded (so per core): the assembler joining the events into a rollout
(prompt reconstruction + sha256 verification + prefix links), the grouper, and ``rederive`` (rewards,
credit, samples) from fixed scores — verifiers are left out, their cost is the task's. Reported per
sample layout (split per call = the default, merged, split + packed).

Memory: the serialized RolloutAssembly of an attempt whose 16 calls have arrived but not its finish
(the largest an in-flight attempt gets).

The end-to-end figure through Kafka (``e2e_tokens_per_s``) comes from ``measure_e2e_tokens_per_s``
(bench/processors_e2e.py: a worker subprocess on private topics of the local broker); it is left out
of the JSON line when no broker answers.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from bench.common import emit
from processors.assembler import RolloutAssembly
from processors.credit import CreditConfig
from processors.grouper import GrouperState, GroupingConfig
from processors.pipeline import rederive
from processors.rewards import RewardConfig
from processors.samples import SampleConfig
from schemas.codec import get_codec
from testkit.stages import AttemptSpec, attempt_events, constant_scores, growing_turns

Event = tuple[str, dict[str, Any]]

REWARD = RewardConfig(metrics=[{"name": "correct", "verifier": "answer_match", "path": "score"}])
CREDIT = CreditConfig()
LAYOUTS = {"split": SampleConfig(), "merged": SampleConfig(merge=True),
           "packed": SampleConfig(pack={"enabled": True, "max_tokens": 32_768})}


def workload(groups: int, group_size: int, calls: int, first_prompt: int, output: int,
             tool: int) -> list[list[Event]]:
    """Per group, the events of its rollouts (each rollout's events in order, rollouts one after another)."""
    rng = np.random.default_rng(0)
    out = []
    for g in range(groups):
        events: list[Event] = []
        for k in range(group_size):
            turns = growing_turns(rng, calls, first_prompt, output, tool)
            events += attempt_events(AttemptSpec(f"g{g}-r{k}", "a1", turns, env_events=calls,
                                                 group_id=f"g{g}", expected_group_size=group_size,
                                                 task_input={"answer": "4"}))
        out.append(events)
    return out


def run_group(events: list[Event], layout: SampleConfig) -> tuple[int, int]:
    """Assemble, group and derive one group; returns (sample tokens, samples)."""
    states: dict[str, RolloutAssembly] = {}
    grouper, cfg = GrouperState(), GroupingConfig()
    rollouts: dict[str, dict[str, Any]] = {}
    closed = []
    for name, rec in events:
        state = states.get(rec["rollout_id"])
        if state is None:
            state = states[rec["rollout_id"]] = RolloutAssembly(rec["rollout_id"])
        for rollout in state.accept(name, rec).rollouts:
            rollouts[rollout["event_id"]] = rollout
            closed += [e.group for e in grouper.add(rollout, cfg).emitted]
    tokens = samples = 0
    for group in closed:
        members = [rollouts[e] for e in group["rollout_event_ids"]]
        values = [{"score": float(i % 2)} for i in range(len(members))]  # a spread: nothing is filtered
        derived = rederive(group, members, constant_scores(group, members, values, "answer_match"), REWARD,
                           CREDIT, layout)
        tokens += sum(len(s["input_ids"]) // 4 for s in derived.samples)
        samples += len(derived.samples)
    return tokens, samples


def inflight_bytes(events: list[Event]) -> int:
    """Serialized state of the first rollout once all its calls and env events are in, before its finish."""
    first = events[0][1]["rollout_id"]
    state = RolloutAssembly(first)
    for name, rec in events:
        if rec["rollout_id"] == first and name != "AttemptFinished":
            state.accept(name, rec)
    return len(state.to_bytes())


def measure_e2e_tokens_per_s() -> float | None:
    """The end-to-end figure: sample tokens/s from events produced to Kafka to samples consumed from
    Kafka, through one processors worker (bench/processors_e2e.py); None when no broker answers."""
    from bench.processors_e2e import measure

    return measure()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.processors", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--first-prompt", type=int, default=2048)
    parser.add_argument("--output", type=int, default=512)
    parser.add_argument("--tool", type=int, default=1500, help="tool-result tokens appended per turn")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per layout (best is kept)")
    args = parser.parse_args(argv)

    print(f"building {args.groups} groups x {args.group_size} rollouts x {args.calls} calls ...", flush=True)
    groups = workload(args.groups, args.group_size, args.calls, args.first_prompt, args.output, args.tool)
    context = args.first_prompt + (args.calls - 1) * (args.output + args.tool) + args.output
    figures: dict[str, Any] = {"calls_per_rollout": args.calls, "final_context_tokens": context,
                               "rollouts": args.groups * args.group_size}
    run_group(groups[0], LAYOUTS["split"])  # warm-up (imports, caches)
    for name, layout in LAYOUTS.items():
        best = float("inf")
        tokens = samples = 0
        for rep in range(args.repeat):
            start = time.process_time()  # CPU time of this (single-threaded) process: per core
            tokens = samples = 0
            for events in groups:
                t, n = run_group(events, layout)
                tokens, samples = tokens + t, samples + n
            best = min(best, time.process_time() - start)
            print(f"  {name}: pass {rep + 1}/{args.repeat} {tokens / best / 1e6:.1f}M tokens/s", flush=True)
        figures[f"{name}_sample_tokens"] = tokens
        figures[f"{name}_samples"] = samples
        figures[f"{name}_tokens_per_s_per_core"] = round(tokens / best)
        figures[f"{name}_ms_per_rollout"] = round(1000 * best / figures["rollouts"], 3)

    codec = get_codec()
    probe = groups[0]
    states: dict[str, RolloutAssembly] = {}
    rollout = next(r for name, rec in probe
                   for r in states.setdefault(rec["rollout_id"], RolloutAssembly(rec["rollout_id"])).accept(
                       name, rec).rollouts)
    figures["completed_rollout_avro_bytes"] = len(codec.encode("CompletedRollout", rollout))
    figures["bytes_per_inflight_rollout"] = inflight_bytes(probe)
    figures["bytes_per_context_token_inflight"] = round(figures["bytes_per_inflight_rollout"] / context, 2)
    figures["core_tokens_per_s_per_core"] = figures["split_tokens_per_s_per_core"]
    e2e = measure_e2e_tokens_per_s()
    if e2e is not None:
        figures["e2e_tokens_per_s"] = e2e
    emit(figures)


if __name__ == "__main__":
    main()
