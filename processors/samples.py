"""Trainable samples from credited rollouts: split per call, merged when the token prefix holds, packed.

* Split (default): one sample per trained call, ``prompt ‖ output``, loss mask 1 on the output. Trained
  calls: successful, sampled ones, less those the credit configuration's ``parse_failures`` policy takes out
  (processors/parse_failures.py); a call that does not train breaks a merged chain.
* Merge (``merge: true``): adjacent trained calls form one sample when ``prompt_i ‖ output_i`` is
  a token-level prefix of ``prompt_{i+1}`` (checked on the exact ids here, not trusted); the sample is
  the last call's ``prompt ‖ output`` with every chained call's output in the loss and everything
  in between (tool results, template tokens) masked out with NaN logprobs. A chain stops before it
  would exceed ``max_sample_tokens``.
* Pack (``pack.enabled``): samples of the group go into bins of ``pack.max_tokens`` (first fit,
  decreasing length); ``sequence_starts`` are the cu_seqlens without the end. A sample longer than a
  bin stays on its own.

Per-token advantages and weights come from ``credit.token_values``; every sampled token appears in
the loss exactly once whatever the layout, with the same value, so a rollout's total weight is the
same split, merged or packed. Each sample lists provenance segments (which call, prompt or output,
which offsets), the score / reward / credit ids and the policy version span. Where some loss token was
sampled by another version than ``policy_version_first`` (calls of several versions merged or packed, or a
call whose tokens span a weight update: its ``version_spans``), ``version_spans`` says which version
sampled each loss token (over sample positions), so the trainer can judge staleness per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from processors.call_tokens import CallTokens, rollout_call_tokens
from processors.config import config_id
from processors.credit import CreditConfig, TokenValues, token_values
from processors.errors import PipelineInputError
from processors.parse_failures import trained_calls
from processors.prefix import common_prefix_len_concat
from schemas.ids import event_id
from schemas.sealing import is_forgotten
from schemas.tokens import FLOAT_DTYPE, IDS_DTYPE, MASK_DTYPE, pack_int32, unpack_floats, unpack_mask
from schemas.version_spans import SpanRecord, VersionSpanError, call_versions_of, check_tiling, merge_adjacent, shifted

Record = dict[str, Any]


class PackSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    max_tokens: int = Field(default=8192, gt=0)


class SampleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    name: str = "default"
    merge: bool = False
    max_sample_tokens: int | None = Field(default=None, gt=0)
    pack: PackSpec = PackSpec()

    @property
    def id(self) -> str:
        return config_id(self)


@dataclass
class Piece:
    """One unpacked sequence (a call, or a merged chain of calls) of one rollout."""

    kind: str
    rollout_id: str
    group_id: str
    ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    advantages: np.ndarray
    weights: np.ndarray
    segments: list[Record]
    policy_versions: list[int]
    refs: dict[str, list[str]] = field(default_factory=dict)
    created_at_us: int = 0
    version_spans: list[SpanRecord] = field(default_factory=list)  # over the piece's loss tokens, in order
    subject: str | None = None  # whose content the tokens are (docs/forgetting.md)


def _segment(rollout_id: str, call: Record, source: str, sample_start: int, call_start: int,
             length: int) -> Record:
    return {"rollout_id": rollout_id, "call_id": call["call_id"], "call_index": int(call["call_index"]),
            "source": source, "sample_start": sample_start, "call_start": call_start, "length": length}


def _chains(trained: list[bool], tokens: list[CallTokens], cfg: SampleConfig) -> list[list[int]]:
    """Positions of the calls forming each sample, in call order (``trained``: the calls whose output is in
    the loss, as the credit stage decided)."""
    chains: list[list[int]] = []
    for i, in_loss in enumerate(trained):
        if not in_loss:
            continue
        tok = tokens[i]
        size = len(tok.prompt) + len(tok.output)
        if cfg.merge and chains and chains[-1][-1] == i - 1 and \
                (cfg.max_sample_tokens is None or size <= cfg.max_sample_tokens):
            prev = tokens[i - 1]
            expected = len(prev.prompt) + len(prev.output)
            if common_prefix_len_concat(prev.prompt, prev.output, tok.prompt) == expected:
                chains[-1].append(i)
                continue
        if len(tok.output) == 0 and not cfg.merge:
            continue  # nothing sampled, nothing to learn from
        chains.append([i])
    return [c for c in chains if any(len(tokens[i].output) for i in c)]


def _piece(rollout: Record, group_id: str, chain: list[int], tokens: list[CallTokens], tv: TokenValues,
           refs: dict[str, list[str]], created_at_us: int) -> Piece:
    calls = rollout["calls"]
    last = tokens[chain[-1]]
    n_prompt = len(last.prompt)
    n = n_prompt + len(last.output)
    ids = np.empty(n, dtype=IDS_DTYPE)
    ids[:n_prompt] = last.prompt
    ids[n_prompt:] = last.output
    mask = np.zeros(n, dtype=MASK_DTYPE)
    logprobs = np.full(n, np.nan, dtype=FLOAT_DTYPE)
    advantages = np.zeros(n, dtype=FLOAT_DTYPE)
    weights = np.zeros(n, dtype=FLOAT_DTYPE)
    segments: list[Record] = []
    spans: list[SpanRecord] = []
    rid = rollout["rollout_id"]
    prev_end = 0
    for i in chain:
        tok, call = tokens[i], calls[i]
        start, length = len(tok.prompt), len(tok.output)
        if start > prev_end:
            segments.append(_segment(rid, call, "PROMPT", prev_end, prev_end, start - prev_end))
        if length:
            end = start + length
            lo, hi = int(tv.offsets[i]), int(tv.offsets[i + 1])
            mask[start:end] = 1
            logprobs[start:end] = unpack_floats(call["output_logprobs"])
            advantages[start:end] = tv.advantages[lo:hi]
            weights[start:end] = tv.weights[lo:hi]
            segments.append(_segment(rid, call, "OUTPUT", start, 0, length))
            spans += shifted(_output_versions(rid, call, length), start)
        prev_end = start + length
    versions = [int(calls[i]["policy_version"]) for i in chain] + [s["version"] for s in spans]
    return Piece("MERGED" if len(chain) > 1 else "CALL", rid, group_id, ids, mask, logprobs, advantages,
                 weights, segments, sorted(set(versions)), refs, created_at_us, merge_adjacent(spans))


def _output_versions(rollout_id: str, call: Record, n_output: int) -> list[SpanRecord]:
    """Which version sampled each of a call's output tokens, as spans over its output."""
    try:
        check_tiling(call.get("version_spans") or [], n_output)
    except VersionSpanError as exc:
        raise PipelineInputError(f"rollout {rollout_id}: call {call['call_id']}: {exc}") from None
    return call_versions_of(call)


def rollout_pieces(rollout: Record, group_id: str, credit: Record, reward: Record, credit_cfg: CreditConfig,
                   cfg: SampleConfig) -> list[Piece]:
    """The unpacked samples of one credited rollout."""
    tokens = rollout_call_tokens(rollout)
    if len(tokens) != len(rollout["calls"]):
        raise PipelineInputError(f"rollout {rollout['rollout_id']}: call tokens do not line up")
    tv = token_values(rollout, credit, credit_cfg)
    refs = {"score_ids": list(reward["score_ids"]), "reward_ids": [reward["event_id"]],
            "credit_ids": [credit["event_id"]]}
    created = int(credit["created_at_us"])
    chains = _chains(trained_calls(rollout, credit_cfg.parse_failures), tokens, cfg)
    subject = rollout.get("subject")
    return [replace(_piece(rollout, group_id, chain, tokens, tv, refs, created), subject=subject) for chain in chains]


def _bins(pieces: list[Piece], cfg: SampleConfig) -> list[list[Piece]]:
    """Pieces into packed sequences. A packed sample holds one subject's tokens only (all of them under
    that subject's key), so forgetting a subject drops whole samples and never changes another's weight."""
    if not cfg.pack.enabled:
        return [[p] for p in pieces]
    by_subject: dict[str | None, list[Piece]] = {}
    for p in pieces:
        by_subject.setdefault(p.subject, []).append(p)
    return [b for same in by_subject.values() for b in _first_fit(same, cfg)]


def _first_fit(pieces: list[Piece], cfg: SampleConfig) -> list[list[Piece]]:
    cap = cfg.pack.max_tokens
    order = sorted(range(len(pieces)), key=lambda i: (-len(pieces[i].ids), i))
    bins: list[list[Piece]] = []
    room: list[int] = []
    for i in order:
        size = len(pieces[i].ids)
        slot = next((b for b, free in enumerate(room) if free >= size), None) if size <= cap else None
        if slot is None:
            bins.append([pieces[i]])
            room.append(cap - size if size <= cap else -1)
        else:
            bins[slot].append(pieces[i])
            room[slot] -= size
    return bins


def _unique(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _sample(bin_: list[Piece], cfg_id: str) -> Record:
    kind = bin_[0].kind if len(bin_) == 1 else "PACKED"
    starts, segments, spans, pos = [], [], [], 0
    for p in bin_:
        starts.append(pos)
        segments += [dict(s, sample_start=s["sample_start"] + pos) for s in p.segments]
        spans += shifted(p.version_spans, pos)
        pos += len(p.ids)

    def joined(attr: str) -> bytes:
        arrays = [getattr(p, attr) for p in bin_]
        return arrays[0].tobytes() if len(arrays) == 1 else np.concatenate(arrays).tobytes()

    credit_ids = sorted({c for p in bin_ for c in p.refs["credit_ids"]})
    versions = [v for p in bin_ for v in p.policy_versions]
    first = min(versions)
    if all(s["version"] == first for s in spans):
        spans = []  # one version for every loss token: policy_version_first says it
    descriptor = [[s["rollout_id"], s["call_id"], s["source"], s["call_start"], s["length"],
                   s["sample_start"]] for s in segments]
    return {
        "event_id": event_id("sample", cfg_id, kind, descriptor, credit_ids), "kind": kind,
        "sample_config_id": cfg_id, "rollout_ids": _unique([p.rollout_id for p in bin_]),
        "group_ids": _unique([p.group_id for p in bin_]),
        "score_ids": sorted({s for p in bin_ for s in p.refs["score_ids"]}),
        "reward_ids": sorted({r for p in bin_ for r in p.refs["reward_ids"]}), "credit_ids": credit_ids,
        "policy_version_first": first, "policy_version_last": max(versions),
        "input_ids": joined("ids"), "loss_mask": joined("mask"), "rollout_logprobs": joined("logprobs"),
        "advantages": joined("advantages"), "weights": joined("weights"),
        "sequence_starts": pack_int32(starts), "segments": segments, "version_spans": spans,
        "created_at_us": max(p.created_at_us for p in bin_),
        "subject": bin_[0].subject, "sealed": None,
    }


def build_samples(group: Record, rollouts: list[Record], rewards: list[Record], credits: list[Record],
                  credit_cfg: CreditConfig, cfg: SampleConfig) -> list[Record]:
    """Samples for every credited rollout of a group (rollouts in group order)."""
    by_rollout = {c["rollout_id"]: c for c in credits}
    rewards_by_id = {r["event_id"]: r for r in rewards}
    pieces: list[Piece] = []
    for rollout in rollouts:
        credit = by_rollout.get(rollout["rollout_id"])
        if credit is None or is_forgotten(rollout):  # a forgotten subject's tokens are gone: never trained
            continue
        reward = rewards_by_id.get(credit["reward_id"])
        if reward is None:
            raise PipelineInputError(f"credit {credit['event_id']} references reward {credit['reward_id']}, "
                                     "which is not among the rewards given")
        pieces += rollout_pieces(rollout, group["group_id"], credit, reward, credit_cfg, cfg)
    cfg_id = cfg.id
    return [_sample(b, cfg_id) for b in _bins(pieces, cfg)]


def weight_by_rollout(sample: Record) -> dict[str, float]:
    """Total loss weight per rollout in one sample (float64 sums over its OUTPUT segments)."""
    weights = unpack_floats(sample["weights"])
    mask = unpack_mask(sample["loss_mask"])
    out: dict[str, float] = {}
    for s in sample["segments"]:
        if s["source"] == "OUTPUT":
            lo, hi = s["sample_start"], s["sample_start"] + s["length"]
            total = float(weights[lo:hi].astype(np.float64).sum())
            if not mask[lo:hi].all():
                raise ValueError(f"sample {sample['event_id']}: an OUTPUT segment is not fully in the "
                                 "loss mask")
            out[s["rollout_id"]] = out.get(s["rollout_id"], 0.0) + total
    return out
