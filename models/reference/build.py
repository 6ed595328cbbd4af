"""Build the embedded reference model: a byte-level BPE tokenizer with a ChatML chat template and a tiny
Qwen2 causal LM, saved in Hugging Face format (``save_pretrained``) so that transformers and vLLM load it.

Everything is deterministic for a given torch/tokenizers build: the corpus comes from a seeded RNG, the
BPE trainer is deterministic for a fixed corpus, and the weights come from a seeded initialisation plus
a short supervised "format warm-up" (``models.reference.warmup``) on the toy lookup task
(``models.reference.task``). The warm-up exists for the demo: a random model cannot emit a parseable
tool call, so online RL would never see a reward. ``--warmup-steps 0`` gives the plain random-weight model.

Output directory: tokenizer.json, tokenizer_config.json, chat_template.jinja, config.json,
generation_config.json, model.safetensors and ``tokentrail_model.json`` (the build manifest: spec,
spec digest, fingerprints). A build is reused when the manifest's spec digest matches.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from models.reference.fingerprint import MANIFEST_NAME, read_manifest, sha256_file, sha256_text
from models.reference.harness_corpus import corpus_sha256, harness_texts
from models.reference.spec import BUILD_VERSION, DEFAULT_SPEC, BuildSpec
from models.reference.template import CHAT_TEMPLATE, MARKER_TOKENS, SPECIAL_TOKENS
from models.reference.tokenizer import train_tokenizer
from models.reference.warmup import warm_up
from models.reference.weights import make_model

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def is_built(model_dir: Path, spec: BuildSpec = DEFAULT_SPEC) -> bool:
    manifest = read_manifest(model_dir)
    return bool(manifest) and manifest.get("spec_digest") == spec.digest() and all(
        (Path(model_dir) / name).is_file() for name in manifest.get("files", {})
    )


def build_model(out_dir: Path, force: bool = False, spec: BuildSpec = DEFAULT_SPEC,
                progress: Progress = _quiet) -> Path:
    """Build (or reuse) the reference model in ``out_dir`` and return the directory."""
    return build_atomically(out_dir, lambda: is_built(out_dir, spec),
                            lambda staging: _build_into(staging, spec, progress),
                            force=force, progress=progress, label=f"spec {spec.digest()}")


def build_atomically(out_dir: Path, built: Callable[[], bool], build_into: Callable[[Path], None], *,
                     force: bool = False, progress: Progress = _quiet, label: str = "") -> Path:
    """Build a model directory with ``build_into(staging)`` unless ``built()`` says the one there matches.

    Concurrent builders serialise on a lock file next to the directory; the files appear atomically
    (built in a temporary sibling directory, then renamed into place)."""
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and built():
            progress(f"model already built in {out_dir} ({label})")
            return out_dir
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
        try:
            build_into(staging)
            for path in staging.iterdir():  # mkdtemp and some writers use 0600/0700
                path.chmod(0o644)
            staging.chmod(0o755)
            if out_dir.exists():
                retired = out_dir.with_name(f".{out_dir.name}-old-{os.getpid()}")
                out_dir.rename(retired)
                shutil.rmtree(retired)
            staging.rename(out_dir)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    return out_dir


def _build_into(target: Path, spec: BuildSpec, progress: Progress) -> None:
    started = time.perf_counter()
    progress("training the byte-level BPE tokenizer")
    tokenizer = train_tokenizer(spec)
    tokenizer.save_pretrained(target)
    progress(f"  vocab {len(tokenizer)} tokens ({time.perf_counter() - started:.1f} s)")
    progress("initialising the Qwen2 model")
    model = make_model(spec, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    progress(f"  {params / 1e6:.2f}M parameters")
    if spec.warmup_steps > 0:
        progress(f"format warm-up: {spec.warmup_steps} steps")
    final_loss = warm_up(spec, model, tokenizer, progress)
    model.save_pretrained(target, safe_serialization=True)
    template_path = target / "chat_template.jinja"
    if not template_path.is_file() or template_path.read_text() != CHAT_TEMPLATE:
        raise RuntimeError("transformers did not save the chat template as chat_template.jinja")
    files = {p.name: sha256_file(p) for p in sorted(target.iterdir()) if p.is_file()}
    manifest = {
        "build_version": BUILD_VERSION,
        "spec": spec.as_dict(),
        "spec_digest": spec.digest(),
        "parameters": params,
        "vocab": len(tokenizer),
        "warmup_final_loss": final_loss,
        "tokenizer_fingerprint": files["tokenizer.json"],
        "chat_template_fingerprint": sha256_text(CHAT_TEMPLATE),
        "files": files,
        "token_ids": {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + MARKER_TOKENS},
    }
    if spec.corpus == "harness":  # the text outside the spec that the tokenizer was trained on
        manifest["corpus_sha256"] = corpus_sha256(harness_texts())
    (target / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    progress(f"built in {time.perf_counter() - started:.1f} s")
