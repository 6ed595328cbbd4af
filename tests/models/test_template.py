"""The built tokenizer and chat template: real behaviour of tools, tool results, reasoning and the
generation prompt, and the renderer agreeing with Hugging Face's apply_chat_template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from models.reference.fingerprint import read_manifest, sha256_text
from models.reference.task import LOOKUP_TOOL, TASK_KEYS, TASK_VALUES, lookup_call, task_messages
from models.reference.template import MARKER_TOKENS, SPECIAL_TOKENS
from producers.rendering import ChatRenderer

TOOLS = [LOOKUP_TOOL]


def _history() -> list[dict[str, Any]]:
    return [
        *task_messages("fox"),
        {**lookup_call("fox"), "reasoning_content": "first reasoning"},
        {"role": "tool", "tool_call_id": "call_0", "content": "red"},
        {"role": "assistant", "content": "red", "reasoning_content": "second reasoning"},
        {"role": "user", "content": [{"type": "text", "text": "and "}, {"type": "text", "text": '"owl"?'}]},
    ]


def test_special_and_marker_tokens(renderer: ChatRenderer) -> None:
    tok = renderer.tokenizer
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    added = {t.content: t for t in tok.added_tokens_decoder.values()}
    for marker in MARKER_TOKENS:
        assert not added[marker].special  # survives skip_special_tokens, like Qwen's markers
        assert len(renderer.encode(marker)) == 1
    marked = "<tool_call>x</tool_call><|im_end|>"
    assert renderer.decode(renderer.encode(marked)) == marked
    assert tok.decode(renderer.encode("<think>a</think><|im_end|>"), skip_special_tokens=True) == "<think>a</think>"


def test_task_words_are_single_tokens(renderer: ChatRenderer) -> None:
    for word in TASK_KEYS + TASK_VALUES:
        assert len(renderer.encode(word)) == 1, word
    question = renderer.encode('What is "fox"?')
    assert renderer.encode("fox")[0] in question  # the same token the call's JSON and the answer use


def test_tools_are_listed_in_the_system_turn(renderer: ChatRenderer) -> None:
    text = renderer.render_text(task_messages("fox"), TOOLS)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nAnswer in one word.\n\n# Tools\n<tools>\n")
    assert json.dumps(LOOKUP_TOOL, ensure_ascii=False) + "\n</tools>" in system
    no_system = renderer.render_text([{"role": "user", "content": "hi"}], TOOLS)
    assert no_system.startswith("<|im_start|>system\n# Tools\n<tools>\n")
    assert renderer.render_text([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_tool_calls_results_and_reasoning_only_for_the_last_assistant(renderer: ChatRenderer) -> None:
    text = renderer.render_text(_history(), TOOLS)
    call = '<tool_call>\n{"name": "lookup", "arguments": {"key": "fox"}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>\n" in text  # first reasoning dropped
    assert "first reasoning" not in text
    assert "<|im_start|>tool\nred<|im_end|>\n" in text
    assert "<|im_start|>assistant\n<think>\nsecond reasoning\n</think>\n\nred<|im_end|>\n" in text
    assert '<|im_start|>user\nand "owl"?<|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\n")
    assert not renderer.render_text(_history(), TOOLS, add_generation_prompt=False).endswith("assistant\n")


def test_arguments_as_dict_or_string_render_the_same(renderer: ChatRenderer) -> None:
    as_string = [*task_messages("owl"), lookup_call("owl")]
    as_dict = [*task_messages("owl"), {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": {"key": "owl"}}}]}]
    assert renderer.render_text(as_string, TOOLS) == renderer.render_text(as_dict, TOOLS)


def test_render_equals_hugging_face_apply_chat_template(model_dir: Path, renderer: ChatRenderer) -> None:
    hf = AutoTokenizer.from_pretrained(str(model_dir))
    for messages, tools in [(_history(), TOOLS), (task_messages("cat"), None), (_history()[:4], TOOLS)]:
        expected = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
        assert renderer.render(messages, tools) == list(expected)
        assert renderer.encode(renderer.render_text(messages, tools)) == list(expected)
        assert renderer.decode(expected) == renderer.render_text(messages, tools)


def test_fingerprints_match_the_files_and_manifest(model_dir: Path, renderer: ChatRenderer) -> None:
    manifest = read_manifest(model_dir)
    assert manifest is not None
    assert renderer.tokenizer_fingerprint == manifest["tokenizer_fingerprint"] == manifest["files"]["tokenizer.json"]
    assert renderer.chat_template_fingerprint == sha256_text((model_dir / "chat_template.jinja").read_text())
    assert renderer.chat_template_fingerprint == manifest["chat_template_fingerprint"]
    assert renderer.stop_token_ids == (2,)
