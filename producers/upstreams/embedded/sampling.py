"""Per-row sampling math: temperature, top-k, top-p, seeded draws and the logprob of each draw.

Pure tensor functions (no model, no threads), so the exact distribution a token was drawn from can be
recomputed in tests from a fresh forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from producers.upstreams.base import LogprobKind, Sampling

GREEDY_EPSILON = 1e-5  # temperatures at or below this mean argmax


@dataclass(frozen=True)
class RowParams:
    temperature: float
    top_k: int
    top_p: float

    @classmethod
    def of(cls, sampling: Sampling) -> RowParams:
        return cls(float(sampling.temperature), int(sampling.top_k), float(sampling.top_p))

    @property
    def greedy(self) -> bool:
        return self.temperature <= GREEDY_EPSILON


def processed_logits(logits: torch.Tensor, rows: Sequence[RowParams]) -> torch.Tensor:
    """The logits of the distribution each row samples from: divided by the temperature (1 for greedy
    rows), then tokens outside top-k and outside the top-p nucleus set to -inf. Shape [B, V]."""
    logits = logits.float()
    temperatures = torch.tensor([1.0 if r.greedy else r.temperature for r in rows], dtype=torch.float32)
    scaled = logits / temperatures[:, None]
    if all(r.top_k <= 0 and r.top_p >= 1.0 for r in rows):
        return scaled
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
    vocab = scaled.shape[-1]
    ranks = torch.arange(vocab)[None, :]
    top_k = torch.tensor([r.top_k if 0 < r.top_k < vocab else vocab for r in rows])
    remove = ranks >= top_k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it already does.
    mass_before = torch.cumsum(probs, dim=-1) - probs
    top_p = torch.tensor([r.top_p for r in rows], dtype=torch.float32)
    remove |= (mass_before >= top_p[:, None]) & (ranks > 0)
    filtered_sorted = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, filtered_sorted)


def sample_rows(processed: torch.Tensor, rows: Sequence[RowParams],
                generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One token per row: argmax for greedy rows, else a draw from softmax(processed) with the row's own
    generator (so a seeded request samples the same ids whatever else shares its batch)."""
    probs = torch.softmax(processed, dim=-1)
    tokens = torch.empty(len(rows), dtype=torch.long)
    for row, params in enumerate(rows):
        if params.greedy:
            tokens[row] = torch.argmax(processed[row])
        else:
            tokens[row] = torch.multinomial(probs[row], 1, generator=generators[row])[0]
    return tokens


def token_logprobs(raw_logits: torch.Tensor, processed: torch.Tensor, tokens: torch.Tensor,
                   kind: LogprobKind) -> torch.Tensor:
    """The logprob of each chosen token: RAW = log_softmax of the unscaled logits; PROCESSED = of the
    distribution actually sampled from (temperature, top-k and top-p applied)."""
    source = raw_logits.float() if kind == "RAW" else processed
    return torch.log_softmax(source, dim=-1).gather(-1, tokens[:, None])[:, 0]
