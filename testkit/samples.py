"""Well-formed Sample records built from (prompt, output) token sequences, for tests and benchmarks.

A record holds one sequence (kind CALL) or several packed ones (kind PACKED, ``sequence_starts``
marking each). Only the output tokens are in the loss mask, with their rollout log probabilities,
one advantage per sequence and a per-token weight.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.ids import call_id, event_id
from schemas.tokens import pack_floats, pack_ids, pack_int32, pack_mask


@dataclass(frozen=True)
class SequenceSpec:
    rollout_id: str
    prompt_ids: npt.NDArray[np.integer]
    output_ids: npt.NDArray[np.integer]
    output_logprobs: npt.NDArray[np.floating]
    advantage: float
    weight: float = 1.0  # per output token
    group_id: str = "group-0"
    call_id: str | None = None  # the call its tokens come from (default: the rollout's first call)
    call_index: int = 0

    @property
    def length(self) -> int:
        return int(len(self.prompt_ids) + len(self.output_ids))


def random_sequence(rng: np.random.Generator, vocab_size: int, prompt_len: int, output_len: int,
                    rollout_id: str, advantage: float | None = None, weight: float = 1.0,
                    group_id: str = "group-0") -> SequenceSpec:
    return SequenceSpec(
        rollout_id=rollout_id,
        prompt_ids=rng.integers(0, vocab_size, prompt_len, dtype=np.uint32),
        output_ids=rng.integers(0, vocab_size, output_len, dtype=np.uint32),
        output_logprobs=-rng.exponential(2.0, output_len).astype(np.float32),
        advantage=float(rng.normal()) if advantage is None else advantage,
        weight=weight,
        group_id=group_id,
    )


def sample_record(sequences: Sequence[SequenceSpec], policy_version: int = 0,
                  sample_config_id: str = "synthetic", created_at_us: int | None = None, *,
                  event_id_: str | None = None, score_ids: Sequence[str] = (), reward_ids: Sequence[str] = (),
                  credit_ids: Sequence[str] = (), version_spans: list[Any] | None = None) -> dict[str, Any]:
    """A Sample record (plain dict for ``codec.encode("Sample", ...)``) packing ``sequences``; the storage
    tests' records name the events they derive from (``event_id_`` and the score / reward / credit ids)."""
    if not sequences:
        raise ValueError("a sample needs at least one sequence")
    ids, mask, logprobs, advantages, weights, starts, segments = [], [], [], [], [], [], []
    offset = 0
    for seq in sequences:
        p, o = len(seq.prompt_ids), len(seq.output_ids)
        if p < 1:
            raise ValueError("every sequence needs at least one prompt token to condition its output")
        starts.append(offset)
        ids += [np.asarray(seq.prompt_ids, dtype=np.uint32), np.asarray(seq.output_ids, dtype=np.uint32)]
        in_loss = np.concatenate([np.zeros(p, np.uint8), np.ones(o, np.uint8)])
        mask.append(in_loss)
        logprobs += [np.full(p, np.nan, np.float32), np.asarray(seq.output_logprobs, np.float32)]
        # Per token as the sample stage writes them: the mask times the value (a prompt token of a negative
        # advantage is -0.0, as in the stage's output).
        advantages.append(in_loss.astype(np.float32) * np.float32(seq.advantage))
        weights.append(in_loss.astype(np.float32) * np.float32(seq.weight))
        cid = seq.call_id or call_id(seq.rollout_id, "attempt-0", 0)
        segments.append(_segment(seq.rollout_id, cid, seq.call_index, "PROMPT", offset, p))
        if o:
            segments.append(_segment(seq.rollout_id, cid, seq.call_index, "OUTPUT", offset + p, o))
        offset += p + o
    input_ids = pack_ids(np.concatenate(ids))
    rollout_ids = list(dict.fromkeys(s.rollout_id for s in sequences))
    record = {
        "event_id": event_id_ or event_id("sample", sample_config_id, rollout_ids,
                                          hashlib.sha256(input_ids).hexdigest()),
        "kind": "CALL" if len(sequences) == 1 else "PACKED",
        "sample_config_id": sample_config_id,
        "rollout_ids": rollout_ids,
        "group_ids": list(dict.fromkeys(s.group_id for s in sequences)),
        "score_ids": list(score_ids),
        "reward_ids": list(reward_ids),
        "credit_ids": list(credit_ids),
        "policy_version_first": policy_version,
        "policy_version_last": policy_version,
        "input_ids": input_ids,
        "loss_mask": pack_mask(np.concatenate(mask)),
        "rollout_logprobs": pack_floats(np.concatenate(logprobs)),
        "advantages": pack_floats(np.concatenate(advantages)),
        "weights": pack_floats(np.concatenate(weights)),
        "sequence_starts": pack_int32(starts),
        "segments": segments,
        "created_at_us": created_at_us if created_at_us is not None else time.time_ns() // 1000,
        "subject": None,
        "sealed": None,
    }
    if version_spans is not None:
        record["version_spans"] = version_spans
    return record


def _segment(rollout_id: str, cid: str, call_index: int, source: str, start: int, length: int) -> dict[str, Any]:
    return {"rollout_id": rollout_id, "call_id": cid, "call_index": call_index, "source": source,
            "sample_start": start, "call_start": 0, "length": length}


def random_sample_records(count: int, rng: np.random.Generator, vocab_size: int,
                          prompt_len: tuple[int, int] = (16, 64), output_len: tuple[int, int] = (8, 64),
                          pack: int = 1, policy_version: int = 0) -> list[dict[str, Any]]:
    """``count`` records, each packing ``pack`` random sequences of random lengths."""
    records = []
    for i in range(count):
        seqs = [
            random_sequence(rng, vocab_size, int(rng.integers(*prompt_len, endpoint=True)),
                            int(rng.integers(*output_len, endpoint=True)), rollout_id=f"rollout-{i}-{j}",
                            group_id=f"group-{i // 4}")
            for j in range(pack)
        ]
        records.append(sample_record(seqs, policy_version=policy_version))
    return records
