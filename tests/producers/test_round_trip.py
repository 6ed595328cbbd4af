"""New prompt text is proven to come back from its ids without decoding only where the tokenizer's
configuration guarantees it (``round_trip_rule``); everything else is still decoded and compared."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from models.reference.task import task_messages
from producers.rendered_prompt import PriorCall
from producers.rendering import ChatRenderer
from producers.tokenizer_config import round_trip_rule

NOT_NFC = "cafe\u0301"  # "café" with a combining accent: NFC composes it, so its ids decode to other text


def _config(renderer: ChatRenderer) -> dict[str, Any]:
    return json.loads(renderer.tokenizer.backend_tokenizer.to_str())


def _round_trips(config: dict[str, Any], text: str) -> bool:
    tokenizer = Tokenizer.from_str(json.dumps(config))
    return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text


def test_the_reference_tokenizer_is_proven_for_ascii_text_only(renderer: ChatRenderer) -> None:
    assert _config(renderer)["normalizer"] == {"type": "NFC"}  # the case the rule must not overreach in
    assert renderer.round_trip == "ascii"
    assert renderer.round_trips("plain <|im_end|>\n<tool_call> text")
    assert not renderer.round_trips(NOT_NFC) and not renderer.round_trips("caf\u00e9")
    assert not renderer.round_trips("ascii and \ufffd")  # its bytes need not be the text's
    assert renderer.decode(renderer.encode(NOT_NFC)) != NOT_NFC  # why: the normalizer rewrote it


ascii_parts = st.sampled_from(["red", " blue", "\n", "\t", "  ", "42", '{"a": 1}', "<|im_end|>", "<|im_start|>",
                               "<think>", "</think>", "<tool_call>", "<|endoftext|>", "<", "|", ">", "\x00", "~"])


@settings(max_examples=80, deadline=None)
@given(st.lists(ascii_parts, max_size=12))
def test_what_the_rule_covers_does_come_back(renderer: ChatRenderer, parts: list[str]) -> None:
    text = "".join(parts)
    assert renderer.round_trips(text)
    assert renderer.decode(renderer.encode(text)) == text


def _mutations() -> dict[str, Any]:
    def prefix_space(c: dict[str, Any]) -> None:
        next(p for p in c["pre_tokenizer"]["pretokenizers"] if p["type"] == "ByteLevel")["add_prefix_space"] = True

    def lstrip(c: dict[str, Any]) -> None:
        next(t for t in c["added_tokens"] if t["content"] == "<think>")["lstrip"] = True

    def lowercase(c: dict[str, Any]) -> None:
        c["normalizer"] = {"type": "Lowercase"}

    def removing_split(c: dict[str, Any]) -> None:
        c["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"

    return {"prefix_space": (prefix_space, "hello"), "lstrip": (lstrip, "a <think>"),
            "lowercase": (lowercase, "Hello"), "removing_split": (removing_split, "one two")}


@pytest.mark.parametrize("name", sorted(_mutations()))
def test_every_condition_guards_a_real_change_of_text(renderer: ChatRenderer, name: str) -> None:
    mutate, text = _mutations()[name]
    config = copy.deepcopy(_config(renderer))
    config["normalizer"] = None  # the reference rule would then be "any": each mutation alone must undo it
    assert round_trip_rule(config) == "any" and _round_trips(config, text)
    mutate(config)
    assert round_trip_rule(config) is None
    assert not _round_trips(config, text)  # the rule would have been wrong


def test_a_byte_missing_from_the_vocabulary_is_not_proven(renderer: ChatRenderer) -> None:
    config = copy.deepcopy(_config(renderer))
    config["normalizer"] = None
    del config["model"]["vocab"]["~"]  # BPE without an unknown token drops what it cannot spell
    config["model"]["merges"] = [m for m in config["model"]["merges"] if "~" not in "".join(m)]
    assert round_trip_rule(config) is None
    assert not _round_trips(config, "a~b")


def test_text_the_normalizer_rewrites_is_decoded_not_assumed(renderer: ChatRenderer) -> None:
    first = renderer.render_spliced(task_messages(NOT_NFC), None, [])
    assert renderer.decode(first.prompt_ids) != first.text  # NFC changed the text: nothing to prove
    assert not first.text_is_exact
    output = [*renderer.encode("fine"), renderer.eos_token_id]
    messages = [*task_messages(NOT_NFC), {"role": "assistant", "content": "fine"},
                {"role": "user", "content": f"more {NOT_NFC}"}]
    later = renderer.render_spliced(messages, None, [PriorCall(0, first.prompt_ids, output)])
    assert not later.text_is_exact and renderer.decode(later.prompt_ids) != later.text


def test_ascii_turns_are_proven_without_decoding_and_decode_exactly(renderer: ChatRenderer) -> None:
    messages = task_messages("fox")
    first = renderer.render_spliced(messages, None, [])
    assert first.text_is_exact and renderer.decode(first.prompt_ids) == first.text
    output = [*renderer.encode("red <think> blue"), renderer.eos_token_id]
    messages = [*messages, {"role": "assistant", "content": "red <think> blue"},
                {"role": "user", "content": "next <|im_end|> turn"}]
    prior = [PriorCall(0, first.prompt_array, output, prompt_text=first.text)]
    decoded: list[list[int]] = []
    decode = renderer.decode

    def recording(ids: Any) -> str:
        decoded.append(list(ids))
        return decode(ids)

    renderer.decode = recording  # type: ignore[method-assign]
    try:
        later = renderer.render_spliced(messages, None, prior)
    finally:
        del renderer.decode
    assert later.text_is_exact and renderer.decode(later.prompt_ids) == later.text
    new_ids = later.prompt_ids[len(first.prompt_ids) + len(output):]
    assert later.spliced and new_ids and new_ids not in decoded  # the new text was not decoded
    assert not any(len(ids) > len(output) for ids in decoded)  # nor the whole prompt
