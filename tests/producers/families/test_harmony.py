"""gpt-oss prompts through openai-harmony (producers/families/harmony.py), on the real o200k vocabulary: the
sampled tool-call turn enters the next prompt as its exact ids (prompt_{i+1} extends prompt_i ‖ output_i across
the tool round trip); where harmony does not keep a sampled turn, the break is named."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from producers.families.harmony import HarmonyChat, Prior

from .family_models import family_dir

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look up the value of a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
SAMPLED_CALL = ('<|channel|>analysis<|message|>I need the fox.<|end|><|start|>assistant<|channel|>commentary '
                'to=functions.lookup <|constrain|>json<|message|>{"key": "fox"}<|call|>')
SAMPLED_ANSWER = ("<|channel|>analysis<|message|>Found it.<|end|><|start|>assistant<|channel|>final<|message|>"
                  "Red.<|return|>")


@pytest.fixture(scope="module")
def chat() -> HarmonyChat:
    return HarmonyChat(family_dir("gpt-oss"), start_date="2026-12-04")


def _ids(chat: HarmonyChat, text: str) -> list[int]:
    return list(chat.encoding.encode(text, allowed_special="all"))


def _call_turn(arguments: str, reasoning: str | None = None) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": arguments}}]}
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    return turn


FIRST = [{"role": "system", "content": "Answer with the lookup tool."}, {"role": "user", "content": "What is the fox?"}]
RETURNED = _call_turn('{"key": "fox"}', "I need the fox.")  # what the gateway answered for SAMPLED_CALL


def test_a_tool_round_trip_extends_the_sampled_ids(chat: HarmonyChat) -> None:
    first = chat.render(FIRST, [LOOKUP])
    text = chat.encoding.decode(first)
    assert text.startswith("<|start|>system<|message|>") and "Current date: 2026-12-04" in text
    assert "# Instructions\n\nAnswer with the lookup tool." in text and text.endswith("<|start|>assistant")
    output = _ids(chat, SAMPLED_CALL)
    # The harness sends the call back re-serialized, without the reasoning: still the same turn.
    second = [*FIRST, _call_turn('{"key":"fox"}'), {"role": "tool", "tool_call_id": "c1", "content": "red"}]
    spliced = chat.splice(second, [LOOKUP], [Prior(0, output, RETURNED, first)])
    assert spliced.ids[:len(first) + len(output)] == first + output
    assert spliced.spliced == [0] and spliced.breaks == []
    assert chat.encoding.decode(spliced.ids[len(first) + len(output):]) == (
        "<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>red<|end|><|start|>assistant")
    # Re-rendered instead (what vLLM's chat path runs): harmony writes the call its own way, so no extension.
    plain = chat.render(second, [LOOKUP])
    assert plain[:len(first)] == first and plain[:len(first) + len(output)] != first + output
    assert 'assistant to=functions.lookup<|channel|>commentary json<|message|>{"key":"fox"}<|call|>' in \
        chat.encoding.decode(plain)
    # The harness changed what came before the turn (here the instructions): the whole prompt is rendered, not
    # a mix of re-rendered history and sampled ids; the break is named.
    changed = [{"role": "system", "content": "Answer briefly."}, *second[1:]]
    kept = np.asarray(first, dtype=np.uint32)  # as the gateway keeps prompts
    rerendered = chat.splice(changed, [LOOKUP], [Prior(0, np.asarray(output, dtype=np.uint32), RETURNED, kept)])
    assert rerendered.ids == chat.render(changed, [LOOKUP]) and rerendered.spliced == []
    assert len(rerendered.breaks) == 1 and rerendered.breaks[0].startswith(
        "call 0: prompt ‖ output is not a prefix of this prompt; they differ from token ")


def test_a_turn_the_harness_changed_is_rendered_from_the_message_and_the_break_named(chat: HarmonyChat) -> None:
    output = _ids(chat, SAMPLED_CALL)
    changed = [*FIRST, _call_turn(json.dumps({"key": "owl"})), {"role": "tool", "tool_call_id": "c1", "content": "?"}]
    spliced = chat.splice(changed, [LOOKUP], [Prior(0, output, RETURNED, chat.render(FIRST, [LOOKUP]))])
    assert spliced.ids == chat.render(changed, [LOOKUP]) and spliced.spliced == []
    assert spliced.breaks == ["call 0: no assistant message in the history equals its output (the harness "
                              "rewrote or dropped it)"]


def test_after_a_final_answer_harmony_drops_analysis_and_the_breaks_are_named(chat: HarmonyChat) -> None:
    calls = [Prior(0, _ids(chat, SAMPLED_CALL), RETURNED),
             Prior(1, _ids(chat, SAMPLED_ANSWER),
                   {"role": "assistant", "content": "Red.", "reasoning_content": "Found it."})]
    history = [*FIRST, RETURNED, {"role": "tool", "tool_call_id": "c1", "content": "red"},
               {"role": "assistant", "content": "Red."}, {"role": "user", "content": "And the owl?"}]
    spliced = chat.splice(history, [LOOKUP], calls)
    assert spliced.spliced == [] and spliced.ids == chat.render(history, [LOOKUP])
    assert spliced.breaks == [
        "call 0, message 2: harmony does not keep the sampled turn (reasoning_dropped)",
        "call 1, message 4: harmony does not keep the sampled turn (reasoning_dropped, turn_end_rewritten)",
        "gpt-oss format: reasoning_dropped, turn_end_rewritten"]
    text = chat.encoding.decode(spliced.ids)
    assert "I need the fox." not in text and "Found it." not in text
    assert "<|start|>assistant<|channel|>final<|message|>Red.<|end|><|start|>user" in text


def test_reasoning_effort_and_unknown_roles(chat: HarmonyChat) -> None:
    assert "Reasoning: high" in chat.encoding.decode(chat.render(FIRST, None, "high"))
    with pytest.raises(ValueError, match="reasoning_effort"):
        chat.render(FIRST, None, "none")
    with pytest.raises(ValueError, match="no role 'function'"):
        chat.render([*FIRST, {"role": "function", "content": "x"}], None)


def test_earlier_prompts_need_not_be_kept_the_latest_proves_the_chain(chat: HarmonyChat) -> None:
    first = chat.render(FIRST, [LOOKUP])
    out0 = _ids(chat, SAMPLED_CALL)
    second = [*FIRST, RETURNED, {"role": "tool", "tool_call_id": "c1", "content": "red"}]
    prompt1 = chat.splice(second, [LOOKUP], [Prior(0, out0, RETURNED, first)]).ids
    call2 = SAMPLED_CALL.replace("fox", "owl")
    returned2 = {**_call_turn('{"key": "owl"}', "I need the owl."), "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "owl"}'}}]}
    out1 = _ids(chat, call2)
    third = [*second, returned2, {"role": "tool", "tool_call_id": "c2", "content": "grey"}]
    # The first call's prompt is no longer kept (the gateway keeps only the latest prompts): still spliced.
    prompt2 = chat.splice(third, [LOOKUP], [Prior(0, out0, RETURNED, None), Prior(1, out1, returned2, prompt1)])
    assert prompt2.spliced == [0, 1] and prompt2.breaks == []
    assert prompt2.ids[:len(prompt1) + len(out1)] == prompt1 + out1
    # Without the latest prompt nothing proves the chain: the full render, the break named.
    unproven = chat.splice(third, [LOOKUP], [Prior(0, out0, RETURNED, None), Prior(1, out1, returned2, None)])
    assert unproven.spliced == [] and unproven.ids == chat.render(third, [LOOKUP])
    assert [b.split(";")[0] for b in unproven.breaks] == ["call 1: prompt ‖ output is not a prefix of this prompt"]
