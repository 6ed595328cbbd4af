"""Helpers shared by the trainer tests (a unique module name, unlike conftest)."""

from __future__ import annotations

from typing import Any

import torch

from schemas.codec import get_codec
from trainer_consumer.sample_view import TrainSample, sample_from_record

VOCAB = 96


def make_tiny_model(seed: int = 0) -> Any:
    """A real (small) Qwen2 causal LM, as the reference engine uses, built in memory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=512, tie_word_embeddings=False, dtype="float32")
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


def decode_round_trip(record: dict[str, Any]) -> TrainSample:
    """Through the real codec, as the trainer receives it."""
    codec = get_codec()
    _, decoded = codec.decode(codec.encode("Sample", record), expect="Sample")
    return sample_from_record(decoded)
