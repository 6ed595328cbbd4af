"""The hermes/think output parser: exact inversion of the template's assistant rendering, and a
streaming variant whose deltas always add up to the final parse."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from producers.parsing import (
    PARSER_VERSION,
    ContentDelta,
    ReasoningDelta,
    StreamingParser,
    ToolCall,
    ToolCallDelta,
    parse_output,
)

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "fox"}}\n</tool_call>'


def test_parser_version_is_pinned() -> None:
    assert PARSER_VERSION == "hermes-think/1"


def test_plain_content() -> None:
    parsed = parse_output("red")
    assert (parsed.content, parsed.reasoning, parsed.tool_calls, parsed.errors) == ("red", None, (), ())


def test_tool_call_only_has_no_content_and_keeps_arguments_verbatim() -> None:
    parsed = parse_output(CALL)
    assert parsed.content is None
    assert parsed.tool_calls == (ToolCall("lookup", '{"key": "fox"}'),)
    compact = parse_output('<tool_call>\n{"name": "lookup", "arguments": {"key":"fox"}}\n</tool_call>')
    assert compact.tool_calls[0].arguments == '{"key":"fox"}'


def test_reasoning_content_and_two_calls() -> None:
    text = "<think>\nneed the key\n</think>\n\nLet me look.\n" + CALL + "\n" + CALL.replace("fox", "owl")
    parsed = parse_output(text)
    assert parsed.reasoning == "need the key"
    assert parsed.content == "Let me look."
    assert [json.loads(c.arguments)["key"] for c in parsed.tool_calls] == ["fox", "owl"]


def test_unterminated_reasoning_is_all_reasoning() -> None:
    parsed = parse_output("<think>\nstill thinking")
    assert parsed.reasoning == "still thinking" and parsed.content is None


def test_bad_blocks_stay_in_content_with_an_error() -> None:
    bad = "ok\n<tool_call>\n{not json}\n</tool_call>"
    parsed = parse_output(bad)
    assert parsed.tool_calls == () and parsed.content == bad
    assert parsed.errors and "invalid JSON" in parsed.errors[0]
    no_name = parse_output('<tool_call>\n{"arguments": {}}\n</tool_call>')
    assert no_name.tool_calls == () and "name" in no_name.errors[0]
    open_block = parse_output('x\n<tool_call>\n{"name": "lookup"')
    assert open_block.content == 'x\n<tool_call>\n{"name": "lookup"' and "unterminated" in open_block.errors[0]


def test_string_arguments_are_decoded_and_reencoded() -> None:
    parsed = parse_output('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert parsed.tool_calls == (ToolCall("f", '{"a": 1}'),)


def test_to_message_is_openai_shaped() -> None:
    message = parse_output("<think>\nr\n</think>\n\n" + CALL).to_message(["call_9"])
    assert message == {
        "role": "assistant", "content": None, "reasoning_content": "r",
        "tool_calls": [{"id": "call_9", "type": "function",
                        "function": {"name": "lookup", "arguments": '{"key": "fox"}'}}],
    }


def test_parse_inverts_the_rendered_assistant_body(renderer) -> None:  # type: ignore[no-untyped-def]
    """parse(body the template renders for a message) == that message, for the last assistant turn."""
    cases = [
        {"role": "assistant", "content": "red"},
        {"role": "assistant", "content": "\nodd\n", "reasoning_content": "\nr\n"},
        {"role": "assistant", "content": None, "reasoning_content": "think",
         "tool_calls": [{"id": "call_0", "type": "function",
                         "function": {"name": "lookup", "arguments": '{"key": "fox"}'}}]},
        {"role": "assistant", "content": "two",
         "tool_calls": [{"id": f"call_{i}", "type": "function",
                         "function": {"name": "lookup", "arguments": json.dumps({"key": k})}}
                        for i, k in enumerate(["fox", "owl"])]},
    ]
    head = [{"role": "user", "content": "q"}]
    prefix = renderer.render_text(head)
    for message in cases:
        text = renderer.render_text([*head, message], add_generation_prompt=False)
        assert text.startswith(prefix) and text.endswith("<|im_end|>\n")
        body = text[len(prefix):-len("<|im_end|>\n")]
        assert parse_output(body).to_message([c["id"] for c in message.get("tool_calls", [])]) == message


# ----------------------------------------------------------------------------------------- streaming
pieces = st.sampled_from([
    "<think>", "</think>", "<tool_call>", "</tool_call>", "\n", "\n\n", "red", " blue", "<", "</",
    '{"name": "lookup", "arguments": {"key": "fox"}}', "{bad", "tool", "think>", "_call>", "x",
])


def _stream(text: str, cuts: list[int]) -> tuple[list[object], object]:
    parser = StreamingParser()
    events: list[object] = []
    last = 0
    for cut in sorted({c % (len(text) + 1) for c in cuts}):
        events += parser.feed(text[last:cut])
        last = cut
    events += parser.feed(text[last:])
    tail, final = parser.finish()
    return events + tail, final


@settings(max_examples=400, deadline=None)
@given(st.lists(pieces, max_size=12), st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_streamed_deltas_add_up_to_the_final_parse(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    events, final = _stream(text, cuts)
    assert final == parse_output(text)
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = [ToolCall(e.name, e.arguments) for e in events if isinstance(e, ToolCallDelta)]
    assert content == (final.content or "")
    assert reasoning == (final.reasoning or "")
    assert tuple(calls) == final.tool_calls
    assert [e.index for e in events if isinstance(e, ToolCallDelta)] == list(range(len(calls)))


def test_streaming_emits_text_before_the_end() -> None:
    parser = StreamingParser()
    assert parser.feed("<think>\nlet") == [ReasoningDelta("let")]
    assert parser.feed(" me\n") == [ReasoningDelta(" me")]
    assert parser.feed("</think>\n\nHi") == [ContentDelta("Hi")]
    assert parser.feed("\n<tool_call>\n{\"name\": \"lookup\",") == []  # held until the block closes
    assert parser.feed(' "arguments": {}}\n</tool_call>') == [ToolCallDelta(0, "lookup", "{}")]
    tail, final = parser.finish()
    assert tail == [] and final.content == "Hi" and final.reasoning == "let me"
