"""The families a model can be built in: the real vocabulary, special tokens, chat template and a tiny
random-weight model of the family's architecture (sized for 2 CPU cores: the embedding of the 128K-200K
vocabulary dominates the parameters).

A ``FamilySpec`` determines the built files; its digest names a build in the manifest (as
``models.reference.spec.BuildSpec`` does for the reference model).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# 1: first family builds.
FAMILY_BUILD_VERSION = 1

TEMPLATES_DIR = Path(__file__).parent / "templates"

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
# sha256 of OpenAI's published o200k_base.tiktoken (tiktoken_ext.openai_public); the built rank file must match.
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


@dataclass(frozen=True)
class FamilySpec:
    name: str
    # Vocabulary: quicktok's bundled files (quicktok/data/<vocab_file>, <special_file>) and its encoding name.
    vocab_file: str
    special_file: str
    quicktok_encoding: str
    vocab_license: str
    split_pattern: str
    nfc: bool  # the family's tokenizer.json has an NFC normalizer (Qwen2/Qwen3)
    template_file: str  # under models/families/templates/
    template_source: str
    template_license: str
    eos_token: str  # the tokenizer's eos_token (chat turn end)
    stop_tokens: tuple[str, ...]  # generation_config eos_token_id: every token that ends a turn
    pad_token: str
    architecture: str  # the transformers model class
    model_type: str
    config: dict[str, Any] = field(default_factory=dict)  # the architecture's config beyond the shared fields
    bos_token: str | None = None  # prepended by the tokenizer's post-processor (with special tokens)
    plain_added_tokens: tuple[str, ...] = ()  # added tokens that are not "special" (kept by skip_special_tokens)
    # Special tokens renamed from the bundled list (id -> text); the remaining ``<|reserved_special_token_N|>``
    # are then numbered again in id order (as Llama 3.1's tokenizer names Llama 3's reserved ids).
    renamed_specials: dict[int, str] = field(default_factory=dict)
    config_vocab_size: int = 0  # the published config's (padded) vocab_size: the embedding's rows
    # The output format and the libraries that render/parse it (recorded as the parser version).
    output_format: str = ""
    tiktoken_file: str | None = None  # also written as a tiktoken rank file with this name (harmony reads it)
    tiktoken_sha256: str | None = None
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 32  # vLLM's CPU attention needs >= 32
    max_positions: int = 32768
    seed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> str:
        template = (TEMPLATES_DIR / self.template_file).read_text()
        payload = json.dumps({"build_version": FAMILY_BUILD_VERSION, **self.as_dict(),
                              "template_sha256": hashlib.sha256(template.encode()).hexdigest()}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def template(self) -> str:
        return (TEMPLATES_DIR / self.template_file).read_text()


_QWEN_PLAIN = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
               "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
               "<think>", "</think>")
_QWEN_VOCAB = dict(vocab_file="qwen3.vocab", special_file="qwen3.special", quicktok_encoding="qwen3",
                   vocab_license="Apache-2.0 (Qwen2.5/Qwen3 tokenizer, via quicktok-v1's bundled data)",
                   split_pattern=QWEN2_PATTERN, nfc=True, eos_token="<|im_end|>",
                   stop_tokens=("<|im_end|>", "<|endoftext|>"), pad_token="<|endoftext|>",
                   plain_added_tokens=_QWEN_PLAIN, config_vocab_size=151936)

FAMILIES: dict[str, FamilySpec] = {
    "qwen3": FamilySpec(
        name="qwen3", **_QWEN_VOCAB,
        template_file="Qwen-Qwen3-0.6B.jinja",
        template_source="Qwen/Qwen3-0.6B chat template, as llama.cpp keeps it (models/templates/Qwen-Qwen3-0.6B.jinja)",
        template_license="Apache-2.0 (Qwen3 model release)",
        architecture="Qwen3ForCausalLM", model_type="qwen3",
        config={"rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
        output_format="qwen3: <think> reasoning, hermes <tool_call> JSON",
    ),
    "qwen3-coder": FamilySpec(
        name="qwen3-coder", **_QWEN_VOCAB,
        template_file="Qwen3-Coder.jinja",
        template_source="Qwen/Qwen3-Coder-30B-A3B-Instruct chat template, as llama.cpp first added it "
                        "(models/templates/Qwen3-Coder.jinja at 1920345c3)",
        template_license="Apache-2.0 (Qwen3-Coder model release)",
        architecture="Qwen3MoeForCausalLM", model_type="qwen3_moe",
        config={"rope_theta": 10000000.0, "rms_norm_eps": 1e-6, "num_experts": 4, "num_experts_per_tok": 2,
                "moe_intermediate_size": 64, "decoder_sparse_step": 1, "norm_topk_prob": True,
                "mlp_only_layers": []},
        output_format="qwen3-coder: XML <tool_call><function=..><parameter=..>",
    ),
    "llama3": FamilySpec(
        name="llama3", vocab_file="llama3.vocab", special_file="llama3.special", quicktok_encoding="llama3",
        vocab_license="Meta Llama 3 Community License (https://llama.meta.com/llama3/license/), "
                      "via quicktok-v1's bundled data; NOT Apache",
        split_pattern=LLAMA3_PATTERN, nfc=False, eos_token="<|eot_id|>",
        stop_tokens=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"), pad_token="<|finetune_right_pad_id|>",
        bos_token="<|begin_of_text|>", config_vocab_size=128256,
        renamed_specials={128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"},
        template_file="meta-llama-Llama-3.1-8B-Instruct.jinja",
        template_source="meta-llama/Llama-3.1-8B-Instruct chat template, as llama.cpp keeps it "
                        "(models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja)",
        template_license="Llama 3.1 Community License (part of the model release)",
        architecture="LlamaForCausalLM", model_type="llama",
        config={"rope_theta": 500000.0, "rms_norm_eps": 1e-5},
        output_format="llama3: JSON tool calls ({\"name\": .., \"parameters\": ..})",
    ),
    "gpt-oss": FamilySpec(
        name="gpt-oss", vocab_file="o200k.vocab", special_file="o200k_harmony.special",
        quicktok_encoding="o200k_harmony",
        vocab_license="MIT (o200k_base / o200k_harmony, OpenAI tiktoken; via quicktok-v1's bundled data)",
        split_pattern=O200K_PATTERN, nfc=False, eos_token="<|return|>",
        stop_tokens=("<|return|>", "<|call|>", "<|endoftext|>"), pad_token="<|endoftext|>",
        config_vocab_size=201088,
        template_file="openai-gpt-oss-120b.jinja",
        template_source="openai/gpt-oss-120b chat template, as llama.cpp keeps it "
                        "(models/templates/openai-gpt-oss-120b.jinja)",
        template_license="Apache-2.0 (gpt-oss model release)",
        architecture="GptOssForCausalLM", model_type="gpt_oss",
        config={"rope_theta": 150000.0, "rms_norm_eps": 1e-5, "num_local_experts": 4,
                "num_experts_per_tok": 2, "experts_per_token": 2, "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"], "swiglu_limit": 7.0,
                "attention_bias": True},
        output_format="harmony: analysis/commentary/final channels, to=functions.X calls",
        tiktoken_file="o200k_base.tiktoken", tiktoken_sha256=O200K_BASE_SHA256,
        max_positions=131072,  # the published 4096 x YaRN factor 32
    ),
}


def family_named(name: str) -> FamilySpec:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(sorted(FAMILIES))}") from None
