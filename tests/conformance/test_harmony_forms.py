"""Harmony header forms the format leaves open (conformance/harmony_forms.py): a tool call's recipient in the role
or the channel section, its JSON content type as ``<|constrain|>json``, ``json`` or none, are one message; any
other difference stays a render mismatch."""

from __future__ import annotations

import pytest

from conformance.harmony_forms import Header, header_variant, parse_header

# A toy vocabulary: one id per piece, so a prompt is written as its pieces.
PIECES = ["<|start|>", "<|message|>", "<|end|>", "<|call|>", "<|channel|>", "<|constrain|>", "assistant", "user",
          "functions.lookup", " to=functions.lookup", " to=functions.find", " to=assistant", "commentary",
          "analysis", " json", "json", " code", " ", "{\"key\": \"fox\"}", "red", "Hi"]
ID = {p: i for i, p in enumerate(PIECES)}


def ids(*pieces: str) -> list[int]:
    return [ID[p] for p in pieces]


def decode(tokens: list[int]) -> str:
    return "".join(PIECES[t] for t in tokens)


def variant(a: list[int], b: list[int]) -> str | None:
    return header_variant(a, b, start=ID["<|start|>"], message=ID["<|message|>"], decode=decode)


USER = ("<|start|>", "user", "<|message|>", "Hi", "<|end|>")
RESULT = ("<|start|>", "functions.lookup", " to=assistant", "<|channel|>", "commentary", "<|message|>", "red",
          "<|end|>")
ARGS = ("<|message|>", "{\"key\": \"fox\"}", "<|call|>")
SAMPLED = ("<|start|>", "assistant", "<|channel|>", "commentary", " to=functions.lookup", " ", "<|constrain|>", "json")
VLLM = ("<|start|>", "assistant", " to=functions.lookup", "<|channel|>", "commentary", " json")
RENDERERS = ("<|start|>", "assistant", " to=functions.lookup", "<|channel|>", "commentary")
NEXT = ("<|start|>", "assistant")


def prompt(call_header: tuple[str, ...], *, args: tuple[str, ...] = ARGS,
           result: tuple[str, ...] = RESULT) -> list[int]:
    return ids(*USER, *call_header, *args, *result, *NEXT)


def test_the_three_forms_of_a_rerendered_tool_call_are_one_message() -> None:
    sampled, vllm, renderers = prompt(SAMPLED), prompt(VLLM), prompt(RENDERERS)
    assert variant(vllm, renderers) == ("'assistant to=functions.lookup<|channel|>commentary json' vs "
                                        "'assistant to=functions.lookup<|channel|>commentary'")
    assert variant(sampled, vllm) is not None and variant(renderers, sampled) is not None
    # A tool result's recipient in the channel section (vLLM 0.32's oss-harmony) is the same message too.
    fork = ("<|start|>", "functions.lookup", "<|channel|>", "commentary", " to=assistant", "<|message|>", "red",
            "<|end|>")
    assert variant(prompt(VLLM, result=fork), vllm) is not None
    assert variant(vllm, vllm) is None  # equal: nothing to excuse


@pytest.mark.parametrize("other", [
    prompt(("<|start|>", "assistant", " to=functions.find", "<|channel|>", "commentary", " json")),  # recipient
    prompt(("<|start|>", "assistant", " to=functions.lookup", "<|channel|>", "analysis", " json")),  # channel
    prompt(("<|start|>", "assistant", " to=functions.lookup", "<|channel|>", "commentary", " code")),  # content type
    prompt(VLLM, args=("<|message|>", "{\"key\": \"fox\"}", "<|end|>")),  # end token
    prompt(VLLM, args=("<|message|>", "red", "<|call|>")),  # content
    ids(*USER, *VLLM, *ARGS, *NEXT),  # a message less
    ids(*USER, *VLLM, *ARGS, *RESULT, "<|start|>", "user"),  # another generation prompt
])
def test_any_other_difference_is_not_a_variant(other: list[int]) -> None:
    assert variant(other, prompt(RENDERERS)) is None


def test_header_parts() -> None:
    assert parse_header("assistant<|channel|>commentary to=functions.x <|constrain|>json") == \
        Header("assistant", "commentary", "functions.x", "json")
    assert parse_header("assistant to=functions.x<|channel|>commentary json") == \
        Header("assistant", "commentary", "functions.x", "json")
    assert parse_header("functions.x to=assistant<|channel|>commentary") == \
        Header("functions.x", "commentary", "assistant", None)
    assert parse_header("assistant to=a<|channel|>commentary to=b") is None  # two recipients
    assert parse_header("assistant<|channel|>commentary json code") is None
    assert parse_header("") is None
