"""Claude Code, unchanged, through the real gateway (issue 18, items 2 and 5): ``claude -p`` on the harness
model variant (its ~49 K-character prompt fits the 64 K context), its model name mapped to the served model,
does a task of three calls with two real Bash executions; every call it made is on Kafka token-exact and the
attempt assembles into a COMPLETE rollout.

The run is the shared ``tokentrail harnesses check`` run (``harnesses_check``), which asserts every call OK
and token-exact, the outputs decoding to the scripted text Claude Code received and the attempt COMPLETE.
This file asserts what is Claude Code's own in the records: it posts ``/v1/messages?beta=true`` with its
``anthropic-beta`` list, ``thinking``, ``metadata``, ``cache_control`` blocks and a role "system" message inside
``messages``: all accepted, the request recorded as sent; its model name is not the served one.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.harnesses.check_run import CheckRun
from tests.producers.gateway.helpers import output_of
from tokentrail.commands.harnesses import ANSWER

pytestmark = pytest.mark.e2e


def test_claude_code_does_a_tool_task_through_the_gateway_and_every_call_is_recorded_token_exact(
        harnesses_check: CheckRun) -> None:
    row = harnesses_check.row("claude")
    assert row["passed"] and row["rollout"] == "COMPLETE" and row["spliced_calls"] == 2, row
    calls, _ = harnesses_check.records("claude")
    served = harnesses_check.settings.model.harness_name
    assert [(c["status"], c["scripted"], c["protocol"], c["streamed"]) for c in calls] == [
        ("OK", True, "anthropic.messages", True)] * 3
    for call in calls:
        request = json.loads(call["request_json"])
        body = request["body"]
        assert request["query"] == "beta=true"
        # Recorded as sent: the name Claude Code asked for (served by the mapped model), thinking, metadata.
        assert body["model"].startswith("claude-") and body["model"] != served
        assert "thinking" in body and "metadata" in body and body["max_tokens"] > 4096
        extra = json.loads(call["sampling"]["extra_json"])
        assert extra["requested_max_tokens"] == body["max_tokens"] > call["sampling"]["max_tokens"]
        ids, logprobs = output_of(call)
        assert len(logprobs) == len(ids) > 0 and np.isfinite(logprobs).all() and (logprobs <= 0).all()
    assert 5_000 < calls[0]["prompt"]["length"] < calls[1]["prompt"]["length"] < calls[2]["prompt"]["length"]
    # Claude Code's result is the scripted answer (the check saw it in its JSON output).
    assert json.loads(calls[2]["response_json"])["content"][0]["text"] == ANSWER
