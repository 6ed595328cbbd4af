"""Calls whose output the family's parser could not parse, and what becomes of their tokens in training.

The gateway parses every chat call's sampled text with the family's parser (producers/families). When the
tool-call markup is broken (malformed JSON/XML, an unclosed ``<tool_call>``, a harmony message cut short)
it answers the way the family's reference server does (the whole text as content, no tool calls) and puts
the parser's errors on the call record (``sampling.extra_json`` ``parse_errors``). The assembler carries
their number onto the rollout (``CompletedRollout.calls[].parse_failures``; null on rollouts stored before
the field existed: not known, treated as parsed).

What such a rollout does in training is the credit configuration's ``parse_failures`` policy:

* ``keep`` (default): the failed call's tokens train like any other, with the reward as scored. This is
  what most RL stacks do (verl, OpenRLHF, prime-rl keep the sampled tokens and let the verifier's reward
  penalise a broken call), and it is in the users' interest: the model learns not to emit broken markup,
  and the failures stay visible in the rewards and in the training data. Dropping them would hide a
  regression of the model's formatting behind a smaller batch.
* ``mask``: the failed calls' output tokens leave the loss (they remain as context in later prompts); the
  rollout's other calls train with its reward.
* ``drop``: a rollout with any failed sampled call trains no token. Its score and reward are still recorded and it
  still counts in its group's reward normalisation (the group saw it); its credit has weight 0.

The credit stage and the sample builder read the same list (``trained_calls``), so a rollout's total loss
weight in its samples is its credit's ``rollout_weight`` whatever the policy (the weight audit holds).
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from processors.call_tokens import is_sampled

Record = dict[str, Any]
ParseFailurePolicy = Literal["keep", "mask", "drop"]
DEFAULT_POLICY: ParseFailurePolicy = "keep"


def recorded_parse_failures(call_record: Record) -> int:
    """How many parse errors a CallRecord names (0: its output parsed, or was never parsed)."""
    extra = (call_record.get("sampling") or {}).get("extra_json") or ""
    if "parse_errors" not in extra:  # the common case, without decoding the JSON
        return 0
    try:
        errors = orjson.loads(extra).get("parse_errors")
    except (orjson.JSONDecodeError, AttributeError):
        return 0  # not JSON (or not an object): nothing the gateway wrote, so no parse outcome in it
    return len(errors) if isinstance(errors, list) else 0


def failed_to_parse(call: Record) -> bool:
    """A rollout call (CompletedRollout.calls[]) whose output the family's parser could not parse."""
    return bool(call.get("parse_failures"))


def parse_failed_call_ids(rollout: Record) -> list[str]:
    return [str(c["call_id"]) for c in rollout["calls"] if failed_to_parse(c)]


def trained_calls(rollout: Record, policy: ParseFailurePolicy) -> list[bool]:
    """Per rollout call: whether its output tokens are in the loss under ``policy``."""
    sampled = [is_sampled(c) for c in rollout["calls"]]
    if policy == "keep":
        return sampled
    failed = [failed_to_parse(c) for c in rollout["calls"]]
    if policy == "drop":  # a scripted output that failed is not the model's failure: it drops nothing
        return [False] * len(sampled) if any(s and f for s, f in zip(sampled, failed, strict=True)) else sampled
    if policy == "mask":
        return [s and not f for s, f in zip(sampled, failed, strict=True)]
    raise ValueError(f"unknown parse failure policy {policy!r} (keep, mask or drop)")
