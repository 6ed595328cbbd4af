from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer_consumer.collate import collate, flatten, split_micro_batches
from trainer_consumer.losses import LossConfig, per_token_loss, token_logprobs


def test_padded_rows_hold_each_sequence_right_padded(make_samples) -> None:
    samples = make_samples(3, pack=2, lengths=[(3, 2), (4, 4), (2, 1)])
    batch = collate(samples, "padded", pad_id=7)
    lengths = [5, 8, 3, 5, 8, 3]
    assert batch.input_ids.shape == (6, 8)
    assert batch.attention_mask is not None
    assert batch.attention_mask.sum(1).tolist() == lengths
    offset = 0
    for s in samples:
        for start, length in zip(s.sequence_starts, s.sequence_lengths(), strict=True):
            row = batch.input_ids[offset]
            assert row[:length].tolist() == s.input_ids[start:start + length].tolist()
            assert (row[length:] == 7).all()
            assert batch.row_sample_ids[offset] == s.sample_id
            offset += 1
    # Per-row provenance: each packed sequence names its own rollout.
    assert batch.row_rollout_ids[:2] == [("r0-0",), ("r0-1",)]
    assert batch.sample_ids == [s.sample_id for s in samples]


def test_packed_positions_restart_per_sequence(make_samples) -> None:
    samples = make_samples(2, pack=2, lengths=[(3, 2), (2, 2)])
    batch = collate(samples, "packed")
    assert batch.input_ids.shape == (1, 18)
    assert batch.attention_mask is None
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3] * 2
    assert batch.cu_seqlens.tolist() == [0, 5, 9, 14, 18]
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.max_seqlen == 5
    assert batch.row_rollout_ids == [("r0-0",), ("r0-1",), ("r1-0",), ("r1-1",)]


def test_nan_logprobs_and_off_mask_values_never_reach_the_tensors(make_samples) -> None:
    samples = make_samples(4, pack=3)
    for layout in ("padded", "packed"):
        batch = collate(samples, layout)
        assert torch.isfinite(batch.rollout_logprobs).all()
        off = ~batch.loss_mask
        assert (batch.weights[off] == 0).all() and (batch.rollout_logprobs[off] == 0).all()
        assert (batch.advantages[off] == 0).all()
    flat = flatten(samples)
    expected_weight = sum(float(s.weights[s.loss_mask != 0].sum()) for s in samples)
    assert flat.weights.sum() == pytest.approx(expected_weight, rel=1e-6)


def test_padded_and_packed_give_the_same_per_token_losses(make_samples, tiny_model) -> None:
    samples = make_samples(5, pack=2, seed=3)
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    per_layout = {}
    for layout in ("padded", "packed"):
        batch = collate(samples, layout)
        with torch.no_grad():
            logp = token_logprobs(tiny_model, batch)
            tl = per_token_loss(logp, batch, cfg)
        flat = batch.flat_tokens
        per_layout[layout] = (flat(logp), flat(tl.loss), flat(batch.loss_mask))
    (lp_a, loss_a, mask_a), (lp_b, loss_b, mask_b) = per_layout["padded"], per_layout["packed"]
    assert torch.equal(mask_a, mask_b)
    assert torch.allclose(lp_a[mask_a], lp_b[mask_b], atol=1e-5)
    assert torch.allclose(loss_a, loss_b, atol=1e-5)
    assert (loss_a[mask_a] != 0).any()


def test_packed_attention_stays_inside_each_sequence(make_samples, tiny_model) -> None:
    """A sequence's log probabilities do not depend on what is packed before it."""
    samples = make_samples(2, pack=3, seed=5)
    with torch.no_grad():
        together = collate(samples, "packed")
        lp_together = together.flat_tokens(token_logprobs(tiny_model, together))
        alone = collate(samples[1:], "packed")
        lp_alone = alone.flat_tokens(token_logprobs(tiny_model, alone))
        # Control: the same tokens with positions running on (one long sequence) do see the past.
        run_on = collate(samples, "packed")
        run_on.position_ids = torch.arange(run_on.num_tokens).unsqueeze(0)
        lp_run_on = run_on.flat_tokens(token_logprobs(tiny_model, run_on))
    first_len = samples[0].num_tokens
    mask = torch.from_numpy(samples[1].loss_mask != 0)
    assert torch.allclose(lp_together[first_len:][mask], lp_alone[mask], atol=1e-5)
    assert not torch.allclose(lp_run_on[first_len:][mask], lp_alone[mask], atol=1e-3)


def test_micro_batch_split_keeps_order_and_token_budget(make_samples) -> None:
    samples = make_samples(10, lengths=[(5, 5), (10, 10), (3, 2)])
    parts = split_micro_batches(samples, max_tokens=25)
    assert [s.sample_id for part in parts for s in part] == [s.sample_id for s in samples]
    for part in parts:
        assert len(part) == 1 or sum(s.num_tokens for s in part) <= 25
    assert split_micro_batches(samples, None) == [samples]


def test_collate_rejects_empty_and_unknown_layout(make_samples) -> None:
    with pytest.raises(ValueError):
        collate([], "padded")
    with pytest.raises(ValueError, match="layout"):
        collate(make_samples(1), "ragged")  # type: ignore[arg-type]


def test_flatten_is_numpy_not_python_lists(make_samples) -> None:
    samples = make_samples(2, lengths=[(1000, 1000)])
    flat = flatten(samples)
    assert isinstance(flat.input_ids, np.ndarray) and flat.input_ids.dtype == np.int64
    assert flat.num_tokens == 4000
