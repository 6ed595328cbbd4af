"""Sampled splits (conformance/splits.py) on gpt-oss's real vocabulary (openai-harmony's o200k, loaded in about a
second): the ids differ from the tokenizer's, the text and harmony's parse do not; headers are never split."""

from __future__ import annotations

from conformance.corpus import Output, ToolCall
from conformance.formats import FORMATS
from conformance.splits import sampled_split
from producers.families.formats import HarmonyFormat
from tests.producers.families.family_models import family_dir

OUTPUT = Output(reasoning="Read the configuration before changing anything else.",
                calls=(ToolCall("read_file", {"path": "config/settings.json"}),))


def test_a_sampled_split_keeps_the_text_and_the_parse() -> None:
    harmony = HarmonyFormat(family_dir("gpt-oss"), tokenizer=None)  # the tokenizer only decodes failures
    enc = harmony._encoding

    def encode(text: str) -> list[int]:
        return list(enc.encode(text, allowed_special="all"))

    written = FORMATS["gpt-oss"].write(OUTPUT)  # ends in <|call|>
    canonical = encode(written)
    split = sampled_split(canonical, encode, enc.decode, harmony=True)
    assert split != canonical and len(split) > len(canonical)
    assert enc.decode(split) == written
    assert harmony.parse(split) == harmony.parse(canonical)
    assert harmony.parse(split).tool_calls[0].name == "read_file"
    # Only message bodies are split: every token up to the first <|message|> is the tokenizer's.
    head = canonical.index(encode("<|message|>")[0])
    assert split[:head] == canonical[:head]
    untouched = sampled_split(canonical, encode, enc.decode, harmony=True, every=10_000)
    assert untouched == canonical
