"""The build spec of the reference model: everything that determines the built files."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

# 2: the template reads enable_thinking (chat_template_kwargs), as Qwen3's does.
# 3: tokenizer.json carries the normalizer and pre-tokenizer transformers runs for Qwen2 models.
BUILD_VERSION = 3


@dataclass(frozen=True)
class BuildSpec:
    """Everything that determines the built files; its digest names a build in the manifest."""

    vocab_size: int = 512  # BPE target (byte alphabet + specials + merges); markers come on top
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4  # head_dim = hidden / heads = 32 (vLLM's CPU attention needs >= 32)
    max_positions: int = 8192
    seed: int = 0
    corpus_dialogues: int = 1500
    corpus_sentences: int = 1500
    warmup_steps: int = 600  # cap of the "copy" phase (it ends when its probe passes)
    warmup_dilute_steps: int = 60
    warmup_answer_copy: float = 0.3  # after the warm-up: how often the answer copies the tool result
    warmup_batch: int = 16
    warmup_lr: float = 3e-3

    def digest(self) -> str:
        payload = json.dumps({"build_version": BUILD_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


DEFAULT_SPEC = BuildSpec()
