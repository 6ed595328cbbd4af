"""Exact (prompt, output) ids of calls, rebuilt from full or delta-encoded prompts and verified.

Prompts are rebuilt by ``schemas.prompt_delta.reconstruct_prompt`` (length + sha256 checked, typed
errors), with a delta's base given as its (prompt, output) pair so the shared prefix is copied once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from processors.errors import CallTokensError
from schemas.prompt_delta import PromptReconstructionError, reconstruct_prompt
from schemas.tokens import IdArray, unpack_floats, unpack_ids

Record = dict[str, Any]


@dataclass(frozen=True)
class CallTokens:
    """One call's exact ids (numpy views where possible)."""

    call_id: str
    call_index: int
    prompt: IdArray
    output: IdArray


def rebuild_prompt(prompt: Record, base: Callable[[str], tuple[IdArray, IdArray] | None]) -> IdArray:
    """Full prompt ids; ``base(call_id)`` returns that call's (prompt, output) or None."""
    return reconstruct_prompt(prompt, base)


def rebuild_calls(calls: Iterable[Record]) -> tuple[list[CallTokens | None], list[CallTokensError]]:
    """Rebuild calls in order; a delta may only refer to an earlier call of the same sequence.

    Returns one entry per call (None where it failed) and the typed errors.
    """
    known: dict[str, tuple[IdArray, IdArray]] = {}
    out: list[CallTokens | None] = []
    errors: list[CallTokensError] = []
    for call in calls:
        try:
            prompt = rebuild_prompt(call["prompt"], known.get)
        except PromptReconstructionError as exc:
            errors.append(CallTokensError(call["call_id"], int(call["call_index"]),
                                          f"{type(exc).__name__}: {exc}"))
            out.append(None)
            continue
        output = unpack_ids(call["output_ids"])
        known[call["call_id"]] = (prompt, output)
        out.append(CallTokens(call["call_id"], int(call["call_index"]), prompt, output))
    return out, errors


def rollout_call_tokens(rollout: Record) -> list[CallTokens]:
    """Exact ids of every call embedded in a CompletedRollout; raises CallTokensError on any failure."""
    tokens, errors = rebuild_calls(rollout["calls"])
    if errors:
        raise errors[0]
    return [t for t in tokens if t is not None]


def output_logprobs(call: Record) -> np.ndarray:
    return unpack_floats(call["output_logprobs"])


def is_sampled(call: Record) -> bool:
    """Calls whose output trains: successful ones that the model sampled. A failed call's partial output,
    and an output the engine was scripted to emit, are never trained on."""
    return call["status"] == "OK" and not call.get("scripted", False)


def sampled_token_count(rollout: Record) -> int:
    return sum(len(c["output_ids"]) // 4 for c in rollout["calls"] if is_sampled(c))
