"""Collation of samples into torch tensors: right-padded rows or one packed row.

Both layouts start from the same flat concatenation of every sample's token arrays (numpy, no
per-token Python), so they hold the same tokens in the same order; ``flat_tokens`` maps either
back to that order, which is how the tests prove padded and packed give the same per-token losses.

Rows are *sequences*, not samples: a PACKED sample with several sequences becomes several padded
rows (attention never crosses a sequence boundary), or several cu_seqlens segments in packed mode.
Per row (or per packed sequence) the batch names the sample and the rollouts it came from.
"""

from __future__ import annotations

import dataclasses
import itertools
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
    """The packed layout's data (padded collation copies rows straight from the samples)."""
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

    def to(self, device: torch.device) -> TokenBatch:
        """The batch with its model inputs and per-token data on ``device`` (itself when already there)."""
        if self.input_ids.device == device:
            return self
        move = lambda t: t.to(device) if t is not None else None  # noqa: E731
        return dataclasses.replace(
            self, input_ids=move(self.input_ids), position_ids=move(self.position_ids),
            attention_mask=move(self.attention_mask), loss_mask=move(self.loss_mask),
            rollout_logprobs=move(self.rollout_logprobs), advantages=move(self.advantages),
            weights=move(self.weights))

    def flat_tokens(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token ``values`` of this batch's shape, in the flat (sample, token) order."""
        if self.layout == "packed":
            return values[0]
        assert self.attention_mask is not None
        return values[self.attention_mask.bool()]

    def from_flat(self, flat: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """The inverse of ``flat_tokens``: per-token values in the flat order laid out in this batch's
        shape (``fill`` on padding)."""
        if flat.shape[0] != self.num_tokens:
            raise ValueError(f"{flat.shape[0]} values for a batch of {self.num_tokens} tokens")
        flat = flat.to(self.input_ids.device)
        if self.layout == "packed":
            return flat.unsqueeze(0)
        assert self.attention_mask is not None
        out = torch.full(self.attention_mask.shape, fill, dtype=flat.dtype, device=flat.device)
        out[self.attention_mask.bool()] = flat
        return out


def collate(samples: Sequence[TrainSample], layout: Layout = "padded", pad_id: int = 0,
            pad_to_multiple_of: int = 1) -> TokenBatch:
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    if layout == "packed":
        return _packed(flatten(samples))
    if layout == "padded":
        return _padded(samples, pad_id, pad_to_multiple_of)
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


def _padded(samples: Sequence[TrainSample], pad_id: int, multiple: int) -> TokenBatch:
    # One row per sequence, copied slice by slice straight from the samples' views (a memcpy per
    # row and array; no intermediate flat copy, no per-token indexing).
    rows: list[tuple[TrainSample, int, int]] = []
    row_sample_ids: list[str] = []
    row_rollout_ids: list[tuple[str, ...]] = []
    for s in samples:
        bounds = [*s.sequence_starts.tolist(), s.num_tokens]
        rows.extend((s, a, b) for a, b in itertools.pairwise(bounds))
        row_sample_ids.extend([s.sample_id] * s.num_sequences)
        row_rollout_ids.extend(s.sequence_rollout_ids)
    lengths = np.fromiter((b - a for _, a, b in rows), dtype=np.int64, count=len(rows))
    width = -(-int(lengths.max()) // multiple) * multiple
    shape = (len(rows), width)
    # np.zeros maps fresh zeroed pages lazily; only a non-zero pad id needs a fill pass.
    ids = np.zeros(shape, dtype=np.int64) if pad_id == 0 else np.full(shape, pad_id, dtype=np.int64)
    attention = np.zeros(shape, dtype=np.int64)
    mask = np.zeros(shape, dtype=np.bool_)
    logprobs = np.zeros(shape, dtype=np.float32)
    advantages = np.zeros(shape, dtype=np.float32)
    weights = np.zeros(shape, dtype=np.float32)
    for r, (s, a, b) in enumerate(rows):
        n = b - a
        ids[r, :n] = s.input_ids[a:b]
        attention[r, :n] = 1
        m = np.not_equal(s.loss_mask[a:b], 0, out=mask[r, :n])
        # NaN marks "not sampled" on the wire; only loss tokens keep their values.
        np.copyto(logprobs[r, :n], s.rollout_logprobs[a:b], where=m)
        np.copyto(advantages[r, :n], s.advantages[a:b], where=m)
        np.copyto(weights[r, :n], s.weights[a:b], where=m)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return TokenBatch(
        layout="padded",
        input_ids=torch.from_numpy(ids),
        position_ids=torch.arange(width, dtype=torch.int64).expand(shape),
        attention_mask=torch.from_numpy(attention),
        loss_mask=torch.from_numpy(mask),
        rollout_logprobs=torch.from_numpy(logprobs),
        advantages=torch.from_numpy(advantages),
        weights=torch.from_numpy(weights),
        cu_seqlens=torch.from_numpy(np.append(starts, lengths.sum()).astype(np.int32)),
        max_seqlen=width,
        row_sample_ids=row_sample_ids,
        row_rollout_ids=row_rollout_ids,
        num_tokens=int(lengths.sum()),
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
