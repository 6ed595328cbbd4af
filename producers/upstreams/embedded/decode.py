"""Batched autoregressive decoding with a KV cache: one prefill over the (left-padded) prompts, then one
single-token forward per step. Synchronous; the embedded engine runs it on its worker thread."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from producers.upstreams.base import LogprobKind
from producers.upstreams.embedded.sampling import RowParams, processed_logits, sample_rows, token_logprobs
from schemas.tokens import TokenIds


@dataclass
class DecodeRow:
    """One request in a batch, and what it produced so far."""

    prompt_ids: TokenIds
    params: RowParams
    max_tokens: int
    stop_ids: frozenset[int]
    seed: int
    # Called with (new ids, their logprobs) after each sampled token; returns False to cancel the row.
    on_token: Callable[[list[int], list[float]], bool] = lambda _ids, _lps: True
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    # Scripted: these ids are emitted instead of samples, with their RAW logprobs; done when they run out.
    forced: Sequence[int] | None = None
    finish_reason: str = ""  # "stop" | "length" | "cancelled" once done
    first_token_at: float = 0.0

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)


@torch.inference_mode()
def decode_batch(model: torch.nn.Module, rows: Sequence[DecodeRow], pad_id: int, kind: LogprobKind,
                 max_positions: int) -> None:
    """Run all rows to completion, filling their outputs in place."""
    from transformers import DynamicCache

    batch = len(rows)
    width = max(len(r.prompt_ids) for r in rows)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, width - len(row.prompt_ids):] = torch.as_tensor(np.asarray(row.prompt_ids, dtype=np.int64))
        attention[i, width - len(row.prompt_ids):] = 1
    padded = bool((attention == 0).any())
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    generators = [torch.Generator().manual_seed(r.seed) for r in rows]
    params = [r.params for r in rows]
    cache = DynamicCache()
    logits = model(
        input_ids=input_ids,
        attention_mask=attention if padded else None,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    ).logits[:, -1, :]
    next_positions = positions[:, -1:] + 1
    lengths = [len(r.prompt_ids) for r in rows]
    while True:
        processed = processed_logits(logits, params)
        tokens = sample_rows(processed, params, generators)
        scripted = [i for i, r in enumerate(rows) if r.forced is not None and not r.done]
        for i in scripted:
            tokens[i] = int(rows[i].forced[len(rows[i].output_ids)])  # type: ignore[index]
        logprobs = token_logprobs(logits, processed, tokens, kind)
        if scripted:  # the model's own distribution: a scripted token may lie outside top-k / top-p
            raw = token_logprobs(logits, processed, tokens, "RAW")
            for i in scripted:
                logprobs[i] = raw[i]
        now = time.perf_counter()
        for i, row in enumerate(rows):
            if row.done:
                continue
            token, logprob = int(tokens[i]), float(logprobs[i])
            row.output_ids.append(token)
            row.output_logprobs.append(logprob)
            lengths[i] += 1
            if not row.first_token_at:
                row.first_token_at = now
            if not row.on_token([token], [logprob]):
                row.finish_reason = "cancelled"
            elif token in row.stop_ids or (row.forced is not None and len(row.output_ids) >= len(row.forced)):
                row.finish_reason = "stop"
            elif len(row.output_ids) >= row.max_tokens or lengths[i] >= max_positions:
                row.finish_reason = "length"
        if all(r.done for r in rows):
            return
        attention = torch.cat([attention, torch.ones((batch, 1), dtype=torch.long)], dim=-1)
        logits = model(
            input_ids=tokens[:, None],
            attention_mask=attention if padded else None,
            position_ids=next_positions,
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1, :]
        next_positions = next_positions + 1
