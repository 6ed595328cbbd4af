"""The named causes of a prefix break in ``tokentrail harnesses check`` (tokentrail/commands/harness_breaks.py):
each cause from a pair of message lists that shows it, and a clean extension names none."""

from __future__ import annotations

from producers.parsing import ParsedOutput, ToolCall
from tokentrail.commands.harness_breaks import (
    CHANGED_SYSTEM,
    COMPACTION,
    INJECTED_REMINDER,
    RESERIALIZED_ARGUMENTS,
    STRIPPED_THINKING,
    break_causes,
)

SYSTEM = {"role": "system", "content": "You are an agent."}
TASK = {"role": "user", "content": "write hi.txt"}
SAMPLED = ParsedOutput(None, "I will write it.", (ToolCall("bash", '{"command": "echo hi > hi.txt"}'),))


def _answer(arguments: str = '{"command": "echo hi > hi.txt"}', reasoning: str | None = "I will write it.") -> dict:
    message = {"role": "assistant", "content": "",
               "tool_calls": [{"id": "x", "type": "function", "function": {"name": "bash", "arguments": arguments}}]}
    return {**message, "reasoning_content": reasoning} if reasoning else message


RESULT = {"role": "tool", "content": "", "tool_call_id": "x"}


def test_a_clean_extension_names_no_cause() -> None:
    assert break_causes([SYSTEM, TASK], SAMPLED, [SYSTEM, TASK, _answer(), RESULT]) == []


def test_each_cause_is_named_from_the_messages() -> None:
    assert break_causes([SYSTEM, TASK], SAMPLED, [{"role": "system", "content": "You are an agent. Today is Monday."},
                                                  TASK, _answer(), RESULT]) == [CHANGED_SYSTEM]
    assert break_causes([SYSTEM, TASK], SAMPLED, [SYSTEM, TASK, _answer(reasoning=None), RESULT]) == [
        STRIPPED_THINKING]
    assert break_causes([SYSTEM, TASK], SAMPLED, [SYSTEM, TASK, _answer('{"command":"echo hi > hi.txt"}'),
                                                  RESULT]) == [RESERIALIZED_ARGUMENTS]
    # Arguments that mean something else are not a re-serialization.
    assert break_causes([SYSTEM, TASK], SAMPLED, [SYSTEM, TASK, _answer('{"command":"rm hi.txt"}'), RESULT]) == []
    context = {"role": "user", "content": "<context>none</context>"}
    assert break_causes([SYSTEM, TASK, context], SAMPLED, [SYSTEM, TASK, _answer(), RESULT, context]) == [
        INJECTED_REMINDER]
    reminder = {"role": "user", "content": "<system-reminder>be brief</system-reminder>"}
    assert break_causes([SYSTEM, TASK], SAMPLED, [SYSTEM, TASK, reminder, _answer(), RESULT]) == [INJECTED_REMINDER]
    summary = {"role": "user", "content": "Summary of the conversation so far: ..."}
    older = [SYSTEM, TASK, {"role": "assistant", "content": "long answer"}, {"role": "user", "content": "more"}]
    assert break_causes(older, SAMPLED, [SYSTEM, summary, _answer(), RESULT]) == [COMPACTION]
