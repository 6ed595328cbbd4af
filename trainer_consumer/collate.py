"""Collation of samples into torch tensors: right-padded rows or one packed row.

Both layouts start from the same flat concatenation of every sample's token arrays (numpy, no
per-token Python), so they hold the same tokens in the same order; ``flat_tokens`` maps either
back to that order, which is how the tests prove padded and packed give the same per-token losses.

Rows are *sequences*, not samples: a PACKED sample with several sequences becomes several padded
rows (attention never crosses a sequence boundary), or several cu_seqlens segments in packed mode.
Per row (or per packed sequence) the batch names the sample and the rollouts it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch

from trainer_consumer.sample_view import TrainSample

Layout = Literal["padded", "packed"]


@dataclass(frozen=True)
class FlatTokens:
    """Every token of the samples, concatenated, with the sequence boundaries."""

    input_ids: npt.NDArray[np.int64]
    loss_mask: npt.NDArray[np.bool_]
    rollout_logprobs: npt.NDArray[np.float32]  # 0 off the loss mask
    advantages: npt.NDArray[np.float32]  # 0 off the loss mask
    weights: npt.NDArray[np.float32]  # 0 off the loss mask
    seq_starts: npt.NDArray[np.int64]  # global start of every sequence
    seq_lengths: npt.NDArray[np.int64]
    seq_sample_ids: list[str]
    seq_rollout_ids: list[tuple[str, ...]]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def flatten(samples: Sequence[TrainSample]) -> FlatTokens:
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    lengths = np.fromiter((s.num_tokens for s in samples), dtype=np.int64, count=len(samples))
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    mask = np.concatenate([s.loss_mask for s in samples]) != 0
    logprobs = np.concatenate([s.rollout_logprobs for s in samples])
    weights = np.concatenate([s.weights for s in samples])
    seq_starts = np.concatenate([s.sequence_starts.astype(np.int64) + off for s, off in zip(samples, offsets,
                                                                                            strict=True)])
    seq_ends = np.append(seq_starts[1:], int(lengths.sum()))
    seq_sample_ids: list[str] = []
    seq_rollout_ids: list[tuple[str, ...]] = []
    for s in samples:
        seq_sample_ids.extend([s.sample_id] * s.num_sequences)
        seq_rollout_ids.extend(s.sequence_rollout_ids)
    return FlatTokens(
        input_ids=np.concatenate([s.input_ids for s in samples], dtype=np.int64),
        loss_mask=mask,
        # NaN marks "not sampled" on the wire; zero it so masked arithmetic never sees NaN.
        rollout_logprobs=np.where(mask, logprobs, np.float32(0)),
        advantages=np.where(mask, np.concatenate([s.advantages for s in samples]), np.float32(0)),
        weights=np.where(mask, weights, np.float32(0)),
        seq_starts=seq_starts,
        seq_lengths=seq_ends - seq_starts,
        seq_sample_ids=seq_sample_ids,
        seq_rollout_ids=seq_rollout_ids,
    )


@dataclass
class TokenBatch:
    """Model inputs plus per-token training data, in either layout.

    padded: shape (rows, max_len), ``attention_mask`` marks real tokens, one sequence per row.
    packed: shape (1, total), ``attention_mask`` is None, ``position_ids`` restart at every
    sequence and ``cu_seqlens`` (int32, sequences + 1) gives the boundaries.
    """

    layout: Layout
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    loss_mask: torch.Tensor  # bool
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    row_sample_ids: list[str]  # per row (padded) or per packed sequence
    row_rollout_ids: list[tuple[str, ...]]
    num_tokens: int

    @property
    def sample_ids(self) -> list[str]:
        return list(dict.fromkeys(self.row_sample_ids))

    def flat_tokens(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token ``values`` of this batch's shape, in the flat (sample, token) order."""
        if self.layout == "packed":
            return values[0]
        assert self.attention_mask is not None
        return values[self.attention_mask.bool()]


def collate(samples: Sequence[TrainSample], layout: Layout = "padded", pad_id: int = 0,
            pad_to_multiple_of: int = 1) -> TokenBatch:
    flat = flatten(samples)
    if layout == "packed":
        return _packed(flat)
    if layout == "padded":
        return _padded(flat, pad_id, pad_to_multiple_of)
    raise ValueError(f"unknown layout {layout!r}; expected 'padded' or 'packed'")


def _cu_seqlens(flat: FlatTokens) -> torch.Tensor:
    return torch.from_numpy(np.append(flat.seq_starts, flat.num_tokens).astype(np.int32))


def _packed(flat: FlatTokens) -> TokenBatch:
    n = flat.num_tokens
    positions = np.arange(n, dtype=np.int64) - np.repeat(flat.seq_starts, flat.seq_lengths)
    row = lambda a: torch.from_numpy(a).unsqueeze(0)  # noqa: E731 - a view, no copy
    return TokenBatch(
        layout="packed",
        input_ids=row(flat.input_ids),
        position_ids=row(positions),
        attention_mask=None,
        loss_mask=row(flat.loss_mask),
        rollout_logprobs=row(flat.rollout_logprobs),
        advantages=row(flat.advantages),
        weights=row(flat.weights),
        cu_seqlens=_cu_seqlens(flat),
        max_seqlen=int(flat.seq_lengths.max()),
        row_sample_ids=flat.seq_sample_ids,
        row_rollout_ids=flat.seq_rollout_ids,
        num_tokens=n,
    )


def _padded(flat: FlatTokens, pad_id: int, multiple: int) -> TokenBatch:
    rows = flat.seq_lengths.shape[0]
    width = int(flat.seq_lengths.max())
    width = -(-width // multiple) * multiple
    # Destination of every token in the (rows, width) grid, computed once for all five arrays.
    row_of = np.repeat(np.arange(rows, dtype=np.int64), flat.seq_lengths)
    col_of = np.arange(flat.num_tokens, dtype=np.int64) - np.repeat(flat.seq_starts, flat.seq_lengths)
    dest = row_of * width + col_of

    def grid(values: npt.NDArray[np.generic], fill: float | int | bool) -> torch.Tensor:
        out = np.full(rows * width, fill, dtype=values.dtype)
        out[dest] = values
        return torch.from_numpy(out.reshape(rows, width))

    attention = np.zeros(rows * width, dtype=np.int64)
    attention[dest] = 1
    return TokenBatch(
        layout="padded",
        input_ids=grid(flat.input_ids, pad_id),
        position_ids=torch.arange(width, dtype=torch.int64).expand(rows, width),
        attention_mask=torch.from_numpy(attention.reshape(rows, width)),
        loss_mask=grid(flat.loss_mask, False),
        rollout_logprobs=grid(flat.rollout_logprobs, 0.0),
        advantages=grid(flat.advantages, 0.0),
        weights=grid(flat.weights, 0.0),
        cu_seqlens=_cu_seqlens(flat),
        max_seqlen=width,
        row_sample_ids=flat.seq_sample_ids,
        row_rollout_ids=flat.seq_rollout_ids,
        num_tokens=flat.num_tokens,
    )


def split_micro_batches(samples: Sequence[TrainSample], max_tokens: int | None) -> list[list[TrainSample]]:
    """Greedy, order-keeping split into micro-batches of at most ``max_tokens`` tokens (a sample
    longer than that gets a micro-batch of its own). ``None`` keeps everything together."""
    if max_tokens is None:
        return [list(samples)] if samples else []
    out: list[list[TrainSample]] = []
    current: list[TrainSample] = []
    used = 0
    for s in samples:
        if current and used + s.num_tokens > max_tokens:
            out.append(current)
            current, used = [], 0
        current.append(s)
        used += s.num_tokens
    if current:
        out.append(current)
    return out
