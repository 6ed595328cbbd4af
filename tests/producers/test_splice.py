"""Prefix-preserving rendering: earlier sampled ids are reused exactly where the template reproduces
them, the text never changes, and where the template drops content the break is reported."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from models.reference.task import LOOKUP_TOOL, task_messages
from producers.rendered_prompt import PriorCall
from producers.rendering import ChatRenderer

TOOLS = [LOOKUP_TOOL]
CALL_TEXT = '<tool_call>\n{"name": "lookup", "arguments": {"key": "fox"}}\n</tool_call>'


def _sampled(renderer: ChatRenderer, text: str) -> list[int]:
    """Ids as the engine returns them after a generation prompt: the text, then <|im_end|>."""
    return [*renderer.encode(text), renderer.eos_token_id]


def _split_tokens(renderer: ChatRenderer, text: str) -> list[int]:
    """A tokenization of ``text`` that is not the canonical one (each word split in two), as a model can
    sample it; it decodes to the same text, but re-tokenizing the text gives other ids."""
    ids: list[int] = []
    for piece in renderer.tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text):
        word = piece[0]
        raw = renderer.tokenizer.backend_tokenizer.decoder.decode([word])
        if len(raw) > 2 and raw.isalpha():
            ids += renderer.encode(raw[:1]) + renderer.encode(raw[1:])
        else:
            ids += renderer.encode(raw)
    assert renderer.decode(ids) == text
    return ids


def _turns(renderer: ChatRenderer, outputs: list[list[int]], tool_results: list[str],
           splice: bool = True) -> tuple[list[list[int]], list[Any]]:
    """Drive a conversation: each call's prompt is rendered from messages (as a harness would send
    them), its output is given; returns the prompts and the rendered results."""
    messages: list[dict[str, Any]] = task_messages("fox")
    prompts: list[list[int]] = []
    results = []
    prior: list[PriorCall] = []
    for index, output in enumerate(outputs):
        result = renderer.render_spliced(messages, TOOLS, prior if splice else [])
        results.append(result)
        prompts.append(result.prompt_ids)
        prior.append(PriorCall(index, result.prompt_ids, output))
        message = renderer.parse(output).to_message([f"call_{index}"])
        messages = [*messages, message]
        if index < len(tool_results):
            messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": tool_results[index]})
    return prompts, results


def test_no_prior_calls_is_plain_rendering(renderer: ChatRenderer) -> None:
    result = renderer.render_spliced(task_messages("owl"), TOOLS, [])
    assert result.prompt_ids == renderer.render(task_messages("owl"), TOOLS)
    assert result.spliced == () and result.breaks == () and result.base_call_index is None


def test_stable_retokenization_splices_to_exactly_the_plain_rendering(renderer: ChatRenderer) -> None:
    outputs = [_sampled(renderer, CALL_TEXT), _sampled(renderer, "red")]
    prompts, results = _turns(renderer, outputs, ["red"])
    plain = renderer.render([*task_messages("fox"), renderer.parse(outputs[0]).to_message(["call_0"]),
                             {"role": "tool", "tool_call_id": "call_0", "content": "red"}], TOOLS)
    assert prompts[1] == plain
    assert prompts[1][: len(prompts[0]) + len(outputs[0])] == prompts[0] + outputs[0]
    assert results[1].base_call_index == 0 and results[1].breaks == ()
    (span,) = results[1].spliced
    assert (span.call_index, span.start, span.end, span.kind) == (0, 0, len(prompts[0]) + len(outputs[0]), "prefix")


def test_unstable_retokenization_keeps_the_sampled_ids(renderer: ChatRenderer) -> None:
    odd = [*_split_tokens(renderer, CALL_TEXT), renderer.eos_token_id]
    assert odd != _sampled(renderer, CALL_TEXT)
    prompts, results = _turns(renderer, [odd, _sampled(renderer, "red")], ["red"])
    assert prompts[1][: len(prompts[0]) + len(odd)] == prompts[0] + odd
    retokenized, _ = _turns(renderer, [odd, _sampled(renderer, "red")], ["red"], splice=False)
    assert retokenized[1][: len(prompts[0]) + len(odd)] != prompts[0] + odd  # the drift splicing avoids
    assert renderer.decode(prompts[1]) == renderer.decode(retokenized[1])  # same text either way
    assert results[1].breaks == ()


def test_dropped_reasoning_is_reported_and_later_outputs_still_spliced(renderer: ChatRenderer) -> None:
    outputs = [
        [*_split_tokens(renderer, "<think>\nI need the tool\n</think>\n\n" + CALL_TEXT), 2],
        [*_split_tokens(renderer, "<think>\nthe tool said red\n</think>\n\nred"), 2],
        _sampled(renderer, "blue"),
    ]
    prompts, results = _turns(renderer, outputs, ["red"])
    # call 1: the first assistant message is still the last one, so its reasoning is rendered: prefix ok
    assert prompts[1][: len(prompts[0]) + len(outputs[0])] == prompts[0] + outputs[0]
    # call 2: the template drops call 0's reasoning; the prefix breaks and says so
    assert prompts[2][: len(prompts[1]) + len(outputs[1])] != prompts[1] + outputs[1]
    assert results[2].base_call_index is None
    assert any("reasoning" in text and text.startswith("call 1") for text in results[2].break_descriptions)
    # call 1's output is still the last assistant message, rendered as sampled: its ids are spliced
    spans = [s for s in results[2].spliced if s.kind == "output"]
    assert [s.call_index for s in spans] == [1]
    assert prompts[2][spans[0].start:spans[0].end] == outputs[1]
    # call 0's message is rendered without its reasoning, so it is re-tokenized, and that is reported
    assert any(text.startswith("call 0, message 2") for text in results[2].break_descriptions)
    assert renderer.decode(prompts[2]) == renderer.render_text(
        [*task_messages("fox"), renderer.parse(outputs[0]).to_message(["call_0"]),
         {"role": "tool", "tool_call_id": "call_0", "content": "red"},
         renderer.parse(outputs[1]).to_message(["call_1"])], TOOLS)


def test_side_calls_do_not_confuse_the_base(renderer: ChatRenderer) -> None:
    """A harness interleaves an unrelated call (e.g. a title request) in the same attempt."""
    main = task_messages("fox")
    p0 = renderer.render(main, TOOLS)
    o0 = [*_split_tokens(renderer, CALL_TEXT), 2]
    side = [{"role": "user", "content": "Title for this chat?"}]
    p1 = renderer.render(side)
    o1 = _sampled(renderer, "fox lookup")
    prior = [PriorCall(0, p0, o0), PriorCall(1, p1, o1)]
    messages = [*main, renderer.parse(o0).to_message(["call_0"]), {"role": "tool", "content": "red"}]
    result = renderer.render_spliced(messages, TOOLS, prior)
    assert result.base_call_index == 0 and result.prompt_ids[: len(p0) + len(o0)] == p0 + o0
    assert result.breaks == ()


def test_harness_edits_are_rendered_as_sent(renderer: ChatRenderer) -> None:
    """An assistant message that no earlier call produced is tokenized from its text."""
    p0 = renderer.render(task_messages("fox"), TOOLS)
    o0 = _sampled(renderer, "red")
    edited = [*task_messages("fox"), {"role": "assistant", "content": "blue"}, {"role": "user", "content": "ok"}]
    result = renderer.render_spliced(edited, TOOLS, [PriorCall(0, p0, o0)])
    assert result.prompt_ids == renderer.render(edited, TOOLS)
    assert result.spliced == () and result.base_call_index is None


def test_length_stopped_output_is_spliced_without_a_stop_token(renderer: ChatRenderer) -> None:
    p0 = renderer.render(task_messages("fox"), TOOLS)
    o0 = _split_tokens(renderer, "red blue")  # cut by max_tokens: no <|im_end|>
    messages = [*task_messages("fox"), {"role": "assistant", "content": "red blue"},
                {"role": "user", "content": "go on"}]
    result = renderer.render_spliced(messages, TOOLS, [PriorCall(0, p0, o0)])
    assert result.prompt_ids[: len(p0) + len(o0)] == p0 + o0
    assert result.prompt_ids[len(p0) + len(o0)] == renderer.eos_token_id  # the template closes the turn
    assert renderer.decode(result.prompt_ids) == renderer.render_text(messages, TOOLS)


words = st.sampled_from(["red", "blue", " fox", "owl", "\n", " ", "lookup", "42", "é", '"', "{", "<think>"])


@settings(max_examples=60, deadline=None)
@given(st.lists(words, min_size=1, max_size=10), st.booleans())
def test_splice_always_decodes_to_the_template_text(renderer: ChatRenderer, parts: list[str],
                                                    canonical: bool) -> None:
    text = "".join(parts)
    output = (renderer.encode(text) if canonical else _split_tokens(renderer, text)) + [2]
    p0 = renderer.render(task_messages("fox"), TOOLS)
    messages = [*task_messages("fox"), renderer.parse(output).to_message(), {"role": "user", "content": "next"}]
    result = renderer.render_spliced(messages, TOOLS, [PriorCall(0, p0, output)])
    assert renderer.decode(result.prompt_ids) == renderer.render_text(messages, TOOLS)
    plain = renderer.render(messages, TOOLS)
    if result.spliced:
        start, end = result.spliced[0].start, result.spliced[0].end
        assert result.prompt_ids[start:end] in (p0 + output, output)
    if canonical and result.spliced and renderer.encode(renderer.decode(output[:-1])) == output[:-1]:
        assert result.prompt_ids == plain  # stable re-tokenization: splicing changes nothing


# ------------------------------------------------------------------ the piecewise proof (no re-decoding)
def _chain(renderer: ChatRenderer, outputs: list[list[int]]) -> list[Any]:
    """As the gateway drives it: each later call gets the earlier prompts' proven texts, not only ids."""
    messages: list[dict[str, Any]] = task_messages("fox")
    prior: list[PriorCall] = []
    results = []
    for index, output in enumerate(outputs):
        result = renderer.render_spliced(messages, TOOLS, prior)
        results.append(result)
        text = renderer.render_text(messages, TOOLS)
        assert renderer.decode(result.prompt_ids) == text  # the contract, checked the slow way
        if result.text_is_exact:
            assert "\ufffd" not in result.text  # so its ids' bytes are exactly the text's
        prior.append(PriorCall(index, result.prompt_array, output,
                               prompt_text=result.text if result.text_is_exact else None))
        messages = [*messages, {"role": "assistant", "content": renderer.output_text(output)},
                    {"role": "user", "content": f"next é {index} 日本"}]
    return results


def test_the_proof_gives_the_same_ids_as_decoding_every_prompt(renderer: ChatRenderer) -> None:
    assert renderer.piecewise  # the reference tokenizer: byte-level decoder (with an NFC normalizer)
    outputs = [_sampled(renderer, CALL_TEXT), [*_split_tokens(renderer, "red and blue"), 2],
               _sampled(renderer, "é 日本 🙂"), _sampled(renderer, "done")]
    proven = _chain(renderer, outputs)
    assert all(r.text_is_exact for r in proven[1:])  # proven piecewise, not by decoding
    renderer.piecewise = False
    try:
        decoded = _chain(renderer, outputs)
    finally:
        renderer.piecewise = True
    for a, b in zip(proven, decoded, strict=True):
        assert a.prompt_ids == b.prompt_ids and a.spliced == b.spliced and a.breaks == b.breaks


def test_an_output_cut_inside_a_character_is_checked_by_decoding(renderer: ChatRenderer) -> None:
    # "é" is two bytes; an output stopped after the first has no valid text of its own.
    first_byte = renderer.tokenizer.backend_tokenizer.token_to_id("Ã")  # byte 0xC3 in the byte alphabet
    assert first_byte is not None and renderer.decode([first_byte]) == "\ufffd"
    results = _chain(renderer, [_sampled(renderer, CALL_TEXT), [first_byte], _sampled(renderer, "ok")])
    assert not results[2].text_is_exact  # U+FFFD in the text: nothing later builds on it unchecked
    assert results[1].text_is_exact
