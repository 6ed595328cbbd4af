"""A decoded Sample record as the trainer sees it: zero-copy numpy views plus provenance.

Token arrays stay views over the Avro ``bytes`` fields (``schemas.tokens``), so decoding a
100k-token sample never walks a Python list. ``check_sample`` proves the arrays fit together
before anything is collated; a sample that fails it is filtered with the reason, never trained on.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.tokens import unpack_floats, unpack_ids, unpack_int32, unpack_mask


@dataclass(frozen=True)
class TrainSample:
    sample_id: str
    kind: str
    rollout_ids: tuple[str, ...]
    group_ids: tuple[str, ...]
    policy_version_first: int
    policy_version_last: int
    input_ids: npt.NDArray[np.uint32]
    loss_mask: npt.NDArray[np.uint8]
    rollout_logprobs: npt.NDArray[np.float32]  # NaN where the token was not sampled
    advantages: npt.NDArray[np.float32]
    weights: npt.NDArray[np.float32]
    sequence_starts: npt.NDArray[np.int32]  # cu_seqlens without the end; [0] for one sequence
    # Per packed sequence: the rollouts whose segments start inside it (from Sample.segments).
    sequence_rollout_ids: tuple[tuple[str, ...], ...]
    # Sample.version_spans as (version, start, end) over token positions: which policy version sampled
    # which loss tokens; empty: every token from policy_version_first (trainer_consumer/staleness.py).
    version_spans: tuple[tuple[int, int, int], ...] = ()
    # Whose content the tokens are (Sample.subject): checked against the key store before every step.
    subject: str | None = None
    created_at_us: int = 0  # Sample.created_at_us: when its content was made (from its inputs' times)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_sequences(self) -> int:
        return int(self.sequence_starts.shape[0])

    def sequence_lengths(self) -> npt.NDArray[np.int64]:
        ends = np.append(self.sequence_starts[1:], self.num_tokens).astype(np.int64)
        return ends - self.sequence_starts.astype(np.int64)


def sample_from_record(rec: dict[str, Any]) -> TrainSample:
    """Views over a decoded ``Sample`` record (no token data is copied)."""
    starts = unpack_int32(rec["sequence_starts"])
    if starts.shape[0] == 0:  # an empty list means one sequence starting at 0
        starts = np.zeros(1, dtype=np.int32)
    return TrainSample(
        sample_id=rec["event_id"],
        kind=rec["kind"],
        rollout_ids=tuple(rec["rollout_ids"]),
        group_ids=tuple(rec["group_ids"]),
        policy_version_first=int(rec["policy_version_first"]),
        policy_version_last=int(rec["policy_version_last"]),
        input_ids=unpack_ids(rec["input_ids"]),
        loss_mask=unpack_mask(rec["loss_mask"]),
        rollout_logprobs=unpack_floats(rec["rollout_logprobs"]),
        advantages=unpack_floats(rec["advantages"]),
        weights=unpack_floats(rec["weights"]),
        sequence_starts=starts,
        sequence_rollout_ids=_sequence_rollouts(starts, rec.get("segments") or [], tuple(rec["rollout_ids"])),
        version_spans=tuple((int(s["version"]), int(s["start"]), int(s["end"]))
                            for s in rec.get("version_spans") or ()),
        subject=rec.get("subject"),
        created_at_us=int(rec.get("created_at_us") or 0),
    )


def _sequence_rollouts(starts: npt.NDArray[np.int32], segments: list[dict[str, Any]],
                       fallback: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    if starts.shape[0] == 1:
        return (fallback,)
    start_list = starts.tolist()
    per_seq: list[dict[str, None]] = [{} for _ in start_list]
    for seg in segments:  # one entry per segment, not per token
        seq = bisect_right(start_list, seg["sample_start"]) - 1
        if 0 <= seq < len(per_seq):
            per_seq[seq][seg["rollout_id"]] = None
    return tuple(tuple(ids) if ids else fallback for ids in per_seq)


def check_sample(s: TrainSample) -> str | None:
    """Why a sample cannot be trained on (a short reason for the filtered counts), or None."""
    n = s.num_tokens
    if n == 0:
        return "malformed:empty"
    for name in ("loss_mask", "rollout_logprobs", "advantages", "weights"):
        if getattr(s, name).shape[0] != n:
            return f"malformed:{name}_length"
    starts = s.sequence_starts
    if starts[0] != 0 or (starts.shape[0] > 1 and not (np.diff(starts) > 0).all()) or starts[-1] >= n:
        return "malformed:sequence_starts"
    cursor = 0
    for _, start, end in s.version_spans:  # in order, not overlapping, inside the sample
        if start < cursor or end <= start or end > n:
            return "malformed:version_spans"
        cursor = end
    mask = s.loss_mask != 0
    if mask[starts].any():
        # The first token of a sequence has no context inside it: nothing conditions it.
        return "malformed:loss_on_sequence_start"
    # Counts instead of boolean indexing (no gathered copies): every loss token must be finite.
    n_loss = np.count_nonzero(mask)
    if np.count_nonzero(np.isfinite(s.rollout_logprobs) & mask) != n_loss:
        return "malformed:missing_rollout_logprob"
    if np.count_nonzero(np.isfinite(s.advantages) & mask) != n_loss:
        return "malformed:non_finite_advantage"
    w_min, w_max = float(s.weights.min()), float(s.weights.max())
    if not (np.isfinite(w_min) and np.isfinite(w_max)):
        return "malformed:non_finite_weight"
    if w_min < 0:
        return "malformed:negative_weight"
    return None
