"""OpenClaw 2026.9.6, unchanged, through the real gateway (issue 18 item 7): ``openclaw agent exec`` (one
isolated headless embedded turn, throwaway HOME and working dir) on a provider of ``api: openai-completions``
whose base URL is the rollout's, does the scripted task of three calls with two real ``exec`` tool runs.

The run is the shared ``tokentrail harnesses check`` run (``harnesses_check``), which already asserts that
every call is recorded OK and token-exact, the outputs decode to what OpenClaw received and the attempt
assembles COMPLETE. This file asserts what is OpenClaw's own in the records: the request as it sent it, the
tool results of the real runs, the rewritten tool-call ids, the logprobs; and, without running the binary,
the prefix-break causes named from each captured OpenClaw request shape (tests/harnesses/captured).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from producers.parsing import ParsedOutput, ToolCall
from tests.harnesses.check_run import CheckRun
from tests.producers.gateway.helpers import output_of
from tokentrail.commands.harness_breaks import INJECTED_REMINDER, RESERIALIZED_ARGUMENTS, break_causes
from tokentrail.commands.harnesses import ANSWER, COUNT, HARNESSES, WRITE, conversation

pytestmark = pytest.mark.e2e

CAPTURED = Path(__file__).resolve().parent / "captured"
INTERNAL_CONTEXT = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"


def _text(content: object) -> str:
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [])


def test_openclaw_requests_tool_runs_and_outputs_as_recorded(harnesses_check: CheckRun) -> None:
    row = harnesses_check.row("openclaw")
    assert row["passed"], row["reason"]
    calls, env = harnesses_check.records("openclaw")
    assert [(c["status"], c["scripted"], c["protocol"], c["streamed"]) for c in calls] == [
        ("OK", True, "openai.chat", True)] * 3
    served = harnesses_check.settings.model.harness_name
    bodies = [json.loads(c["request_json"])["body"] for c in calls]
    responses = [json.loads(c["response_json"]) for c in calls]
    for call, body in zip(calls, bodies, strict=True):
        # As OpenClaw sent it: its provider's model id, its 8192-token cap (served with what fits, both kept),
        # its 11 tools behind a compact tool-search surface, its STABLE/DYNAMIC system prompt, and its internal
        # context message last.
        assert body["model"] == served and body["tool_choice"] == "auto" and body["stream"] is True
        extra = json.loads(call["sampling"]["extra_json"])
        assert body["max_completion_tokens"] == extra["requested_max_tokens"] == 8192 > call["sampling"]["max_tokens"]
        assert "exec" in {t["function"]["name"] for t in body["tools"]} and len(body["tools"]) == 11
        messages = body["messages"]
        assert messages[0]["role"] == "system" and messages[0]["content"].startswith("<!-- openclaw:attempt:STABLE")
        assert messages[-1]["role"] == "user" and _text(messages[-1]["content"]).startswith(INTERNAL_CONTEXT)
        ids, logprobs = output_of(call)
        assert len(logprobs) == len(ids) > 0 and np.isfinite(logprobs).all() and (logprobs <= 0).all()
    assert 5_000 < calls[0]["prompt"]["length"] < calls[1]["prompt"]["length"] < calls[2]["prompt"]["length"]

    # The gateway's tool calls reached OpenClaw's exec tool: the next request carries the real results.
    tool_results = [_text(m["content"]).strip() for m in bodies[2]["messages"] if m["role"] == "tool"]
    assert tool_results == ["hello", "6"]
    sent = [responses[i]["choices"][0]["message"]["tool_calls"][0] for i in (0, 1)]
    assert [json.loads(s["function"]["arguments"])["command"] for s in sent] == [WRITE, COUNT]
    echoed = [m["tool_calls"][0] for m in bodies[2]["messages"] if m["role"] == "assistant"]
    # OpenClaw drops the underscore from the ids and re-serializes the arguments compactly.
    assert [e["id"] for e in echoed] == [s["id"].replace("_", "") for s in sent]
    assert [e["function"]["arguments"] for e in echoed] == [
        json.dumps(json.loads(s["function"]["arguments"]), separators=(",", ":")) for s in sent]
    assert responses[2]["choices"][0]["message"]["content"] == ANSWER
    assert [name for name, _ in env] == ["AttemptStarted", "AttemptFinished"]
    assert HARNESSES["openclaw"].script[-1] == ANSWER


def _sampled(reply: dict) -> ParsedOutput:
    """The first reply of a captured run as the gateway would have parsed its own output."""
    if "message" in reply:
        calls = [ToolCall(t["function"]["name"], t["function"]["arguments"])
                 for t in reply["message"].get("tool_calls") or []]
    else:
        calls = [ToolCall(b["name"], json.dumps(b["input"])) for b in reply["content"] if b["type"] == "tool_use"]
    return ParsedOutput(None, None, tuple(calls))


@pytest.mark.parametrize(("run", "protocol", "causes"), [
    ("openclaw-tool", "openai.chat", [INJECTED_REMINDER, RESERIALIZED_ARGUMENTS]),
    ("openclaw-local-tool", "openai.chat", [INJECTED_REMINDER, RESERIALIZED_ARGUMENTS]),
    # Anthropic tool input is an object: nothing to re-serialize, the moved context message remains.
    ("openclaw-anthropic-tool", "anthropic.messages", [INJECTED_REMINDER]),
])
def test_the_prefix_break_causes_of_each_captured_openclaw_shape(run: str, protocol: str, causes: list[str]) -> None:
    first, second = (json.loads(line) for line in (CAPTURED / f"{run}.jsonl").read_text().splitlines())
    previous, current = conversation(protocol, first["body"])[0], conversation(protocol, second["body"])[0]
    assert break_causes(previous, _sampled(first["reply"]), current) == causes
    # The same request sent again after the tool result would be a clean extension: nothing named.
    assert break_causes(current, _sampled(second["reply"]), [*current, {"role": "assistant", "content": "ok"}]) == []
