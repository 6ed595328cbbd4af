"""Building the reference model: deterministic, cached by spec, atomic, loadable by transformers, and
reachable from the CLI."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from models.reference.build import build_model, is_built
from models.reference.fingerprint import MANIFEST_NAME, read_manifest
from models.reference.spec import DEFAULT_SPEC, BuildSpec
from tokentrail.commands.model import register

# Small, with a token warm-up: seconds to build, the same code path as the default build.
QUICK = replace(DEFAULT_SPEC, corpus_dialogues=300, corpus_sentences=300, warmup_steps=2, warmup_dilute_steps=2,
                warmup_batch=2)


def test_default_model_shape(model_dir: Path) -> None:
    config = AutoConfig.from_pretrained(str(model_dir))
    assert config.model_type == "qwen2"
    assert config.hidden_size // config.num_attention_heads >= 32  # vLLM CPU attention
    assert config.max_position_embeddings >= 4096
    assert 500 <= config.vocab_size <= 1100
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    parameters = sum(p.numel() for p in model.parameters())
    assert parameters == read_manifest(model_dir)["parameters"]  # type: ignore[index]
    assert 200_000 <= parameters <= 3_000_000
    assert is_built(model_dir)


def test_build_is_deterministic_and_cached(tmp_path: Path) -> None:
    first = build_model(tmp_path / "a", spec=QUICK)
    second = build_model(tmp_path / "b", spec=QUICK)
    one, two = read_manifest(first), read_manifest(second)
    assert one is not None and two is not None
    assert one["files"] == two["files"]  # byte-identical tokenizer, template, config and weights
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    messages: list[str] = []
    assert build_model(first, spec=QUICK, progress=messages.append) == first.resolve()
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp and "already built" in messages[0]
    rebuilt = build_model(first, spec=QUICK, force=True)
    assert (rebuilt / "model.safetensors").stat().st_mtime_ns != stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".a-")]  # no staging left behind


def test_a_different_spec_rebuilds(tmp_path: Path) -> None:
    built = build_model(tmp_path / "m", spec=QUICK)
    other = replace(QUICK, seed=1)
    assert not is_built(built, other)
    build_model(built, spec=other)
    manifest = read_manifest(built)
    assert manifest is not None and manifest["spec_digest"] == other.digest()
    assert (built / MANIFEST_NAME).stat().st_mode & 0o777 == 0o644 and built.stat().st_mode & 0o777 == 0o755


def test_cli_builds_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="tokentrail")
    register(parser.add_subparsers(dest="command"))
    target = tmp_path / "cli-model"
    args = parser.parse_args(["model", "build", "--dir", str(target), "--warmup-steps", "0"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.splitlines()[-2])
    assert summary["spec_digest"] == BuildSpec(warmup_steps=0).digest()
    assert "training the byte-level BPE tokenizer" in out
    info = parser.parse_args(["model", "info", "--dir", str(target)])
    assert info.func(info) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer_fingerprint"] == summary["tokenizer_fingerprint"]
    missing = parser.parse_args(["model", "info", "--dir", str(tmp_path / "none")])
    from tokentrail.errors import CliError

    with pytest.raises(CliError, match="no model"):
        missing.func(missing)


def test_tokenizer_json_is_what_transformers_runs(model_dir: Path) -> None:
    # transformers loads a qwen2 model's tokenizer with Qwen2's normalizer and split pattern whatever the
    # file says; the built file says the same, so the file (and its fingerprint) describes what runs.
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    running = AutoTokenizer.from_pretrained(str(model_dir)).backend_tokenizer
    loaded = json.loads(running.to_str())
    written = json.loads((model_dir / "tokenizer.json").read_text())
    for key in ("normalizer", "pre_tokenizer", "decoder", "post_processor", "added_tokens"):
        assert written[key] == loaded[key], key
    for key in ("vocab", "merges"):
        assert written["model"][key] == loaded["model"][key], key
    alone = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in ["It's 12345 -- OK?\n\n  x", "caf\u00e9 \u4e2d\u6587 \U0001f600", "<|im_start|>user\nhi<|im_end|>"]:
        assert alone.encode(text, add_special_tokens=False).ids == running.encode(text, add_special_tokens=False).ids
