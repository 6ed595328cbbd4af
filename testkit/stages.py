"""Test and benchmark helpers of the stage core: whole attempts from token lists, groups, scores,
chat renderings with known ids, and verifiers that crash, hang or exit (no tokenizer needed).

``attempt_events`` produces the AttemptStarted / CallRecord / EnvStep / AttemptFinished records one
attempt emits (built by ``schemas.builders``), with prompts delta-encoded on the previous call as the
gateway does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import orjson

from processors.verifiers.base import GroupVerifier, RolloutVerifier, RolloutView
from schemas.builders import T0_US, make_call, make_env, make_finished, make_started
from schemas.ids import call_id
from schemas.tokens import IdArray

Record = dict[str, Any]
Event = tuple[str, Record]

@dataclass
class Turn:
    """One call: its exact prompt and sampled output ids (and optionally its text and policy version)."""

    prompt: IdArray
    output: IdArray
    text: str = ""
    policy_version: int = 0
    status: str = "OK"
    logprobs: np.ndarray | None = None


@dataclass
class AttemptSpec:
    rollout_id: str
    attempt_id: str
    turns: list[Turn]
    task_input: Any = None
    group_id: str | None = None
    group_key: dict[str, str] = field(default_factory=dict)
    expected_group_size: int | None = None
    attempt_number: int = 1
    env_events: int = 0
    finish_status: str = "SUCCESS"
    delta: bool = True  # delta-encode prompts on the previous call, as the gateway does
    t0_us: int = T0_US


def attempt_events(spec: AttemptSpec) -> list[Event]:
    """Start, calls, env events and finish of one attempt, in their natural order."""
    r, a = spec.rollout_id, spec.attempt_id
    events: list[Event] = [("AttemptStarted", make_started(
        r, a, task_input=spec.task_input, group_id=spec.group_id, group_key=spec.group_key,
        expected_group_size=spec.expected_group_size, attempt_number=spec.attempt_number,
        created_at_us=spec.t0_us))]
    prev: tuple[str, IdArray] | None = None
    for i, turn in enumerate(spec.turns):
        events.append(("CallRecord", make_call(
            r, a, i, turn.prompt, turn.output, logprobs=turn.logprobs, base=prev if spec.delta else None,
            policy_version=turn.policy_version, status=turn.status, text=turn.text,
            received_at_us=spec.t0_us + 1000 * (i + 1))))
        prev = (call_id(r, a, i), np.concatenate([turn.prompt, turn.output]))
    for j in range(spec.env_events):
        call = call_id(r, a, min(j, len(spec.turns) - 1)) if spec.turns else None
        at = spec.t0_us + 1000 * (j + 1) + 500
        events.append(("EnvStep", make_env(r, a, j, call=call, created_at_us=at)))
    events.append(("AttemptFinished", make_finished(
        r, a, len(spec.turns), spec.env_events, status=spec.finish_status,
        created_at_us=spec.t0_us + 1000 * (len(spec.turns) + 2))))
    return events


def growing_turns(rng: np.random.Generator, n_calls: int, first_prompt: int, output_len: int,
                  tool_len: int, vocab: int = 151_936, texts: Sequence[str] | None = None) -> list[Turn]:
    """A multi-turn agent trace where every prompt extends the previous prompt ‖ output exactly."""
    prompt = rng.integers(0, vocab, first_prompt, dtype=np.uint32)
    turns = []
    for i in range(n_calls):
        output = rng.integers(0, vocab, output_len, dtype=np.uint32)
        logprobs = -rng.random(output_len, dtype=np.float32) * 4
        turns.append(Turn(prompt, output, text=texts[i] if texts else f"turn {i}", logprobs=logprobs))
        tool = rng.integers(0, vocab, tool_len, dtype=np.uint32)
        prompt = np.concatenate([prompt, output, tool])
    return turns


def assemble(spec: AttemptSpec) -> Record:
    """The rollout the assembler emits for one attempt's events."""
    from processors.assembler import RolloutAssembly

    state = RolloutAssembly(spec.rollout_id)
    emitted = [r for name, rec in attempt_events(spec) for r in state.accept(name, rec).rollouts]
    if len(emitted) != 1:
        raise AssertionError(f"expected one rollout, got {len(emitted)}")
    return emitted[0]


def full_group(rollouts: Sequence[Record], group_id: str = "g", status: str = "FULL") -> Record:
    """A RolloutGroup record for these rollouts (as the grouper would close it)."""
    from processors.grouper import Member, group_record

    members = [Member(r["rollout_id"], r["event_id"], int(r["created_at_us"])) for r in rollouts]
    return group_record(group_id, "{}", status, len(members), members,
                        max(m.created_at_us for m in members))


def constant_scores(group: Record, rollouts: Sequence[Record], values: Sequence[Any],
                    verifier: str = "v") -> list[Record]:
    """OK scores with the given raw values, one per rollout (for reward / credit / sample tests)."""
    from processors.verifiers.runner import score_id

    return [{"event_id": score_id(verifier, "1", "ROLLOUT", r["event_id"], group["event_id"]),
             "rollout_id": r["rollout_id"], "rollout_event_id": r["event_id"], "group_id": group["group_id"],
             "verifier_name": verifier, "verifier_version": "1", "scope": "ROLLOUT", "status": "OK",
             "raw_json": orjson.dumps(v).decode(), "error": None, "duration_ms": 0.0,
             "created_at_us": int(r["created_at_us"])} for r, v in zip(rollouts, values, strict=True)]


# ------------------------------------------------------------------------- chat-template simulations
#
# Real templates do not simply concatenate: they put control tokens at message boundaries and some
# drop earlier reasoning. These tiny renderers produce token ids the way such templates do, so the
# prefix logic can be tested on the shapes that break naive merging.

IM_START, IM_END, THINK, END_THINK, NEWLINE = 151_644, 151_645, 151_667, 151_668, 198
ROLE_IDS = {"system": 9125, "user": 872, "assistant": 77091, "tool": 14172}


@dataclass
class Message:
    role: str
    content: list[int]
    reasoning: list[int] = field(default_factory=list)


def render(messages: Sequence[Message], *, drop_past_reasoning: bool = False,
           generation_prompt: bool = True) -> list[int]:
    """ChatML-like rendering: <|im_start|>role\\n content <|im_end|>\\n per message.

    With ``drop_past_reasoning`` (as Qwen3's template does) the reasoning of assistant messages
    before the last user message is removed from the history.
    """
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    ids: list[int] = []
    for i, m in enumerate(messages):
        ids += [IM_START, ROLE_IDS[m.role], NEWLINE]
        if m.role == "assistant" and m.reasoning and not (drop_past_reasoning and i < last_user):
            ids += [THINK, *m.reasoning, END_THINK, NEWLINE]
        ids += [*m.content, IM_END, NEWLINE]
    if generation_prompt:
        ids += [IM_START, ROLE_IDS["assistant"], NEWLINE]
    return ids


def sampled_output(content: list[int], reasoning: list[int] | None = None) -> list[int]:
    """What the model samples after the generation prompt: [<think> r </think>\\n] content <|im_end|>."""
    out: list[int] = []
    if reasoning:
        out += [THINK, *reasoning, END_THINK, NEWLINE]
    return [*out, *content, IM_END]


# ------------------------------------------------------------------------- misbehaving verifiers
# Importable by "testkit.stages:Name", so the runner's process isolation can load them too.


class CrashingVerifier(RolloutVerifier):
    name: ClassVar[str] = "crashes"
    version: ClassVar[str] = "0"

    def verify(self, view: RolloutView) -> Any:
        raise RuntimeError(f"verifier bug on {view.rollout_id}")


class SleepingVerifier(RolloutVerifier):
    name: ClassVar[str] = "sleeps"
    version: ClassVar[str] = "0"
    default_timeout_s: ClassVar[float] = 0.2

    def verify(self, view: RolloutView) -> Any:
        import time

        time.sleep(30)
        return 1.0


class ExitingVerifier(RolloutVerifier):
    """Kills its own process (a segfaulting native extension looks the same to the runner)."""

    name: ClassVar[str] = "exits"
    version: ClassVar[str] = "0"

    def verify(self, view: RolloutView) -> Any:
        import os

        os._exit(3)


class NaNVerifier(RolloutVerifier):
    name: ClassVar[str] = "nan"
    version: ClassVar[str] = "0"

    def verify(self, view: RolloutView) -> Any:
        return {"score": float("nan")}


class ConstantVerifier(RolloutVerifier):
    """Returns the task input's ``score`` field (a number, a dict, anything JSON)."""

    name: ClassVar[str] = "constant"
    version: ClassVar[str] = "1"

    def verify(self, view: RolloutView) -> Any:
        return view.task_input.get("score")


class PartialGroupVerifier(GroupVerifier):
    """Answers for the first rollout of the group only."""

    name: ClassVar[str] = "partial_group"
    version: ClassVar[str] = "0"

    def verify_group(self, views: list[RolloutView], prior: dict[str, dict[str, Any]]) -> Any:
        return {views[0].rollout_id: {"seen": len(views)}}
