"""Build a family's model directory: the real vocabulary as ``tokenizer.json``, the family's published
chat template, and a tiny random-weight model of its architecture, in Hugging Face format (what
transformers, the embedded engine and vLLM load). Cached like the reference model: a build is reused
while its manifest's spec digest matches, and it appears atomically (``build_atomically``).

Files: tokenizer.json, tokenizer_config.json, chat_template.jinja, config.json, generation_config.json,
model.safetensors, NOTICE (the licenses of what the directory holds), the family's tiktoken rank file
where a library reads one (gpt-oss: ``o200k_base.tiktoken`` for openai-harmony), and the manifest
``tokentrail_model.json`` (``family`` names the family; fingerprints of every file).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from models.families.spec import FAMILY_BUILD_VERSION, FamilySpec
from models.families.vocab import (
    build_tokenizer,
    check_against_quicktok,
    quicktok_data_dir,
    read_ranks,
    read_specials,
    tiktoken_text,
)
from models.reference.build import Progress, build_atomically
from models.reference.fingerprint import MANIFEST_NAME, read_manifest, sha256_file, sha256_text

NOTICE_PATH = Path(__file__).parent / "NOTICE"
RANK_FILE = "vocab.tiktoken"  # the family's BPE ranks as a tiktoken rank file (its sha256 names the vocabulary)


def _quiet(_: str) -> None:
    return None


def is_family_built(model_dir: Path, spec: FamilySpec) -> bool:
    manifest = read_manifest(model_dir)
    return bool(manifest) and manifest.get("family") == spec.name and manifest.get("spec_digest") == spec.digest() \
        and all((Path(model_dir) / name).is_file() for name in manifest.get("files", {}))


def build_family(out_dir: Path, spec: FamilySpec, *, force: bool = False, progress: Progress = _quiet) -> Path:
    """Build (or reuse) ``spec``'s model in ``out_dir`` and return the directory."""
    return build_atomically(out_dir, lambda: is_family_built(out_dir, spec),
                            lambda staging: _build_into(staging, spec, progress),
                            force=force, progress=progress, label=f"family {spec.name}, spec {spec.digest()}")


def _build_into(target: Path, spec: FamilySpec, progress: Progress) -> None:
    from transformers import PreTrainedTokenizerFast

    started = time.perf_counter()
    data = quicktok_data_dir()
    ranks = read_ranks(data / spec.vocab_file)
    specials = read_specials(data / spec.special_file)
    rank_text = tiktoken_text(ranks)
    rank_file = target / RANK_FILE
    rank_file.write_text(rank_text)
    vocab_sha256 = sha256_text(rank_text)
    if spec.tiktoken_file is not None:
        if spec.tiktoken_sha256 is not None and vocab_sha256 != spec.tiktoken_sha256:
            raise RuntimeError(f"{spec.name}: the rank file's sha256 {vocab_sha256} is not the published "
                               f"{spec.tiktoken_sha256}")
        rank_file.rename(target / spec.tiktoken_file)
        rank_file = target / spec.tiktoken_file
    progress(f"{spec.name}: {len(ranks)} BPE ranks + {len(specials)} special tokens (sha256 {vocab_sha256[:16]})")
    backend = build_tokenizer(spec, rank_file, specials)
    checked = check_against_quicktok(spec, backend)
    progress(f"  tokenizer.json built; {checked} ids agree with quicktok ({time.perf_counter() - started:.1f} s)")
    if spec.tiktoken_file is None:
        rank_file.unlink()  # only kept where a library reads it
    template = spec.template()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=spec.bos_token, eos_token=spec.eos_token, pad_token=spec.pad_token,
        unk_token=None, chat_template=template)
    tokenizer.model_max_length = spec.max_positions
    tokenizer.save_pretrained(target)
    if (target / "chat_template.jinja").read_text() != template:
        raise RuntimeError("transformers did not save the chat template as chat_template.jinja")
    model = make_family_model(spec, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(target, safe_serialization=True)
    shutil.copyfile(NOTICE_PATH, target / "NOTICE")
    progress(f"  {spec.architecture}: {params / 1e6:.2f}M parameters ({time.perf_counter() - started:.1f} s)")
    files = {p.name: sha256_file(p) for p in sorted(target.iterdir()) if p.is_file()}
    manifest = {
        "build_version": FAMILY_BUILD_VERSION,
        "family": spec.name,
        "spec": spec.as_dict(),
        "spec_digest": spec.digest(),
        "parameters": params,
        "vocab": len(tokenizer),
        "vocab_sha256": vocab_sha256,
        "vocab_license": spec.vocab_license,
        "template_source": spec.template_source,
        "template_license": spec.template_license,
        "tokenizer_fingerprint": files["tokenizer.json"],
        "chat_template_fingerprint": sha256_text(template),
        "files": files,
        "token_ids": {t: tokenizer.convert_tokens_to_ids(t) for t in (spec.eos_token, *spec.stop_tokens)},
    }
    (target / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    progress(f"built in {time.perf_counter() - started:.1f} s")


def make_family_model(spec: FamilySpec, tokenizer: Any) -> Any:
    """A tiny random-weight model of the family's architecture, seeded, fp32, untied embeddings (the
    trainer and the policy store handle a plain state dict with no shared tensors)."""
    import torch
    import transformers
    from transformers import AutoConfig

    stop_ids = [int(tokenizer.convert_tokens_to_ids(t)) for t in spec.stop_tokens]
    config = AutoConfig.for_model(
        spec.model_type,
        vocab_size=max(spec.config_vocab_size, len(tokenizer)),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=False,
        eos_token_id=stop_ids,
        bos_token_id=None if spec.bos_token is None else tokenizer.convert_tokens_to_ids(spec.bos_token),
        pad_token_id=tokenizer.convert_tokens_to_ids(spec.pad_token),
        dtype="float32",
        **spec.config,
    )
    config.architectures = [spec.architecture]
    torch.manual_seed(spec.seed)
    model = getattr(transformers, spec.architecture)(config)
    model.generation_config.eos_token_id = stop_ids
    return model


