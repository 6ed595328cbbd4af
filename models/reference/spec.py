"""The build spec of the reference model: everything that determines the built files."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

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
    # "task": the toy task's dialogues and filler text. "harness": that plus text like real agent harnesses
    # send (their captured requests, Python sources and docs: prose, JSON schemas, code, shell output).
    corpus: str = "task"

    def as_dict(self) -> dict[str, Any]:
        """The spec's fields, leaving out those added later while they keep their default, so the digest
        and the manifest of a spec that does not use them stay what they were (the default build unchanged)."""
        values = asdict(self)
        return {f.name: values[f.name] for f in fields(self)
                if f.name not in _LATER_FIELDS or values[f.name] != f.default}

    def digest(self) -> str:
        payload = json.dumps({"build_version": BUILD_VERSION, **self.as_dict()}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


_LATER_FIELDS = frozenset({"corpus"})

DEFAULT_SPEC = BuildSpec()

# A model whose context holds a real harness's prompt with room to spare (Claude Code's first request is
# ~49 K characters): a 16 K byte-level BPE trained on harness-like text, 64 K positions, random weights
# (the format warm-up is the toy task's; harness runs script their outputs). Two layers, hidden 128: the
# embedded engine prefills 30 K tokens on two CPU cores in seconds (bench/long_prompt.py).
HARNESS_SPEC = BuildSpec(vocab_size=16384, max_positions=65536, corpus="harness", warmup_steps=0)

SPECS: dict[str, BuildSpec] = {"tiny": DEFAULT_SPEC, "harness": HARNESS_SPEC}


def spec_named(name: str) -> BuildSpec:
    """The named build spec; a clear error naming the known ones otherwise."""
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model spec {name!r}; known: {', '.join(sorted(SPECS))}") from None
