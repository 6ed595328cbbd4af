"""The fast ASCII encoder gives exactly the tokenizer's ids, on the reference model's tokenizer (a Qwen2-style
split pattern) and on a GPT-2-style byte-level one; configurations outside its argument get no encoder,
and an encoder that would be wrong is refused by its own check before use."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers

from producers import ascii_encoder
from producers.ascii_encoder import AsciiEncoder, ascii_pattern
from producers.gateway.text_side import ModelTextSide
from producers.rendering import ChatRenderer
from producers.token_cache import PrefixTokenCache
from schemas.local_paths import REPO_ROOT
from tokentrail.settings import Settings

from .trained import train_bpe

PIECES = ["<|im_start|>", "<|im_end|>", "<|im_", "<tool_call>", "</think>", "<think>", "<", "|", ">", " ", "  ",
          "\n", "\n\n", "\r\n", "\t", "hello", " World", "'s", "'T", "don't", "'ll", "123", "4", " 56", "3.14",
          "!!", " ?", "...", "_", "x_y", "\x0b", "\x0c", "\x1c", "\x00", "\x7f", "{\"a\": [1, 2]}", "é", "日本"]


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


@functools.cache
def _gpt2_style() -> Tokenizer:
    return train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                     [AddedToken("<a>", normalized=False), AddedToken("<b>", normalized=True)],
                     decoders.ByteLevel())


# Llama 3's split pattern (numbers in runs of up to three digits), as its tokenizer.json carries it.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@functools.cache
def _llama3_style() -> Tokenizer:
    split = pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated")
    return train_bpe(pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                               use_regex=False)]),
                     [AddedToken("<|eot|>", normalized=False, special=True)], decoders.ByteLevel())


@functools.cache
def _encoder_for(tokenizer: Tokenizer) -> AsciiEncoder | None:
    """The encoder of a tokenizer, built once for the hundreds of generated examples (building it reads the
    tokenizer's JSON and runs its self-check: ~20 ms an example). Its only state is its memo of pieces,
    whose every entry an earlier example compared with the tokenizer's ids, as the gateway's long-lived
    encoder does."""
    return AsciiEncoder.for_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def reference(renderer: ChatRenderer) -> Tokenizer:
    return renderer.tokenizer.backend_tokenizer


texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(st.characters(max_codepoint=127), max_size=12)),
                 min_size=1, max_size=25).map("".join)


@settings(max_examples=400, deadline=None)
@given(texts)
def test_reference_tokenizer_ids_are_exact(reference: Tokenizer, text: str) -> None:
    encoder = _encoder_for(reference)
    assert encoder is not None
    ids = encoder.encode(text)
    if text.isascii():
        assert ids == _ids(reference, text)
    else:
        assert ids is None  # left to the tokenizer


@pytest.mark.parametrize(("make", "tail"), [(lambda: _gpt2_style(), "<b><a>x"),
                                            (lambda: _llama3_style(), " 1234567 <|eot|>x")], ids=["gpt2", "llama3"])
@settings(max_examples=300, deadline=None)
@given(text=texts)
def test_other_split_patterns_give_exact_ids(make: Callable[[], Tokenizer], tail: str, text: str) -> None:
    tokenizer = make()
    encoder = _encoder_for(tokenizer)
    assert encoder is not None
    for sample in (text, text + tail):  # the tail: added tokens of each kind, long digit runs
        assert encoder.encode(sample) == (_ids(tokenizer, sample) if sample.isascii() else None)


def test_the_reference_model_gets_an_encoder_and_the_cache_uses_it(renderer: ChatRenderer) -> None:
    cache = renderer.token_cache
    assert cache.ascii_encoder is not None
    text = renderer.render_text([{"role": "user", "content": "It's 12:30 -- where's the fox?\n\n  ok"}])
    assert cache.encode(text).tolist() == renderer.render([{"role": "user",
                                                           "content": "It's 12:30 -- where's the fox?\n\n  ok"}])
    mixed = text + "caf\u00e9 <|im_end|>\nplain"  # the non-ASCII piece goes to the tokenizer, the rest not
    assert cache.encode(mixed).tolist() == renderer.encode(mixed)


@pytest.mark.parametrize("make", [
    lambda: train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=True), []),  # a prefix space per piece
    lambda: train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), [], dropout=0.5),  # random merges
    lambda: train_bpe(pre_tokenizers.Metaspace(), []),  # not byte-level
    lambda: train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), [], normalizer=normalizers.Lowercase()),
    lambda: train_bpe(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{Lu}\p{Ll}+"), "isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False)]), []),
    lambda: train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), [AddedToken("<a>", rstrip=True)]),
], ids=["prefix-space", "dropout", "metaspace", "lowercase", "unicode-subclass", "stripping-added-token"])
def test_configurations_outside_the_argument_get_no_encoder(make: object) -> None:
    assert callable(make)
    assert AsciiEncoder.for_tokenizer(make()) is None


def test_an_nfc_normalizer_is_accepted() -> None:
    tokenizer = train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), [], normalizer=normalizers.NFC())
    encoder = AsciiEncoder.for_tokenizer(tokenizer)
    assert encoder is not None and encoder.encode("Hello, World's 42") == _ids(tokenizer, "Hello, World's 42")


def test_gaps_between_matches_are_left_to_the_tokenizer() -> None:
    # A split pattern that does not match every character: the tokenizer keeps each gap as one piece.
    tokenizer = train_bpe(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"[a-z]+"), "isolated"),
                                                   pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                            use_regex=False)]), [])
    encoder = AsciiEncoder.for_tokenizer(tokenizer)
    assert encoder is not None
    assert encoder.encode("hello world") is None  # " " is a gap
    assert encoder.encode("hello") == _ids(tokenizer, "hello")
    cache = PrefixTokenCache(tokenizer, [])
    assert cache.encode("the fox, 12 owls").tolist() == _ids(tokenizer, "the fox, 12 owls")


def test_a_wrong_translation_is_refused_by_the_self_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # Forget the space a word takes with it: " the" would become " " + "the", and the ids would change.
    wrong = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d|[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+", re.ASCII)
    monkeypatch.setattr(ascii_encoder, "ascii_pattern", lambda source: wrong)
    assert AsciiEncoder.for_tokenizer(_gpt2_style()) is None


@pytest.mark.parametrize("pattern", [r"^\p{L}+", r"\p{L}+$", r"(?<=a)b", r"(?>a+)", r"\p{Lu}", r"[[:alpha:]]",
                                     r"[a-z&&[^x]]", r"\h+", r"(?i)a", r"[]a]", r"[a"])
def test_patterns_not_read_alike_are_not_translated(pattern: str) -> None:
    assert ascii_pattern(pattern) is None


def test_translated_classes_match_the_same_ascii_characters() -> None:
    pattern = ascii_pattern(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|\s+(?!\S)|(?i:'s)")
    assert pattern is not None
    assert pattern.findall("x1234 It'S  \u00e9") == ["x", "123", "4", " It", "'S", " "]
    reference = json.loads(_gpt2_style().to_str())["pre_tokenizer"]
    assert reference["type"] == "ByteLevel" and reference["use_regex"]


def test_bench_tokenize_prints_its_figures_with_every_text_exact() -> None:
    run = subprocess.run([sys.executable, "-m", "bench.tokenize", "--texts", "4", "--tokens", "400"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["mismatched_texts"] == 0 and figures["texts"] == 4
    assert figures["tokens_per_text"] > 200 and figures["tokenizer_us_per_text"] > 0 and figures["speedup"] > 0


def test_the_gateway_setting_switches_the_fast_path_off(model_dir: Path, tokentrail_settings: Settings) -> None:
    from producers.gateway.wiring import make_text_side

    def text_side(fast: bool) -> ModelTextSide:
        gateway = tokentrail_settings.gateway.model_copy(update={"fast_ascii_tokenize": fast, "upstream": "x"})
        return make_text_side(tokentrail_settings.model_copy(update={"gateway": gateway}))

    fast, plain = text_side(True), text_side(False)
    assert fast.renderer.token_cache.ascii_encoder is not None
    assert plain.renderer.token_cache.ascii_encoder is None
    messages = [{"role": "user", "content": "It's 42 -- ok?"}]
    assert fast.render_chat(messages, None, prefix_mode="retokenize", prior=[]).array().tolist() == \
        plain.render_chat(messages, None, prefix_mode="retokenize", prior=[]).array().tolist()


def test_each_distinct_part_reaches_the_bpe_model_once(reference: Tokenizer) -> None:
    encoder = AsciiEncoder.for_tokenizer(reference)
    assert encoder is not None
    seen: list[str] = []

    class Counting:
        def tokenize(self, part: str) -> Any:
            seen.append(part)
            return reference.model.tokenize(part)

    encoder._model, encoder._memo = Counting(), {}
    text = "owl owl owl fox owl fox 7 7"
    assert encoder.encode(text) == _ids(reference, text)
    # Its parts: "owl", " owl" (x3), " fox" (x2), " ", "7", " ", "7": five distinct, each tokenized once.
    assert len(seen) == len(set(seen)) == 5
