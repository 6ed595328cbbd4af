"""A real harness, unchanged, through the real gateway (issue 18): Pi runs headless against a rollout's
base URL, does a task of three calls with two real shell-tool executions, and every call it made is on Kafka
token-exact; the attempt assembles into a COMPLETE rollout.

The run is the shared ``tokentrail harnesses check`` run (``harnesses_check``, the harness model variant),
which asserts every call OK and token-exact (the recorded prompt decodes to a fresh render of the recorded
request, id for id where nothing was spliced), the outputs decoding to the scripted text Pi received, and the
attempt COMPLETE. This file asserts what is Pi's own in the records.

The tiny reference model cannot choose a harness's tools by itself, so the rollout is scripted (POST
/v1/rollouts ``script``): the engine emits the given tool calls token by token, with the model's own
logprobs, and the records say ``scripted`` (nothing trains on them). Everything else is real: the
harness's requests, its tool executions, the gateway's rendering, tokenizing, parsing and recording.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.harnesses.check_run import CheckRun
from tests.producers.gateway.helpers import output_of

pytestmark = pytest.mark.e2e


def test_pi_does_a_tool_task_through_the_gateway_and_every_call_is_recorded_token_exact(
        harnesses_check: CheckRun) -> None:
    row = harnesses_check.row("pi")
    assert row["passed"] and row["rollout"] == "COMPLETE", row
    calls, _ = harnesses_check.records("pi")
    assert [(c["status"], c["scripted"], c["protocol"], c["streamed"]) for c in calls] == [
        ("OK", True, "openai.chat", True)] * 3
    bodies = [json.loads(c["request_json"])["body"] for c in calls]
    for call, body in zip(calls, bodies, strict=True):
        # Pi asked for 16384 output tokens; it was served what fits, and the record keeps both numbers.
        extra = json.loads(call["sampling"]["extra_json"])
        assert body["max_completion_tokens"] == extra["requested_max_tokens"] == 16384
        assert call["sampling"]["max_tokens"] < 16384
        ids, logprobs = output_of(call)
        assert len(logprobs) == len(ids) > 0 and np.isfinite(logprobs).all() and (logprobs <= 0).all()
    # The later calls extend the earlier ones: Pi resends the conversation, the prompt grows, and carries
    # the real results of both shell runs.
    assert calls[0]["prompt"]["length"] < calls[1]["prompt"]["length"] < calls[2]["prompt"]["length"]
    results = [m["content"] for m in bodies[2]["messages"] if m["role"] == "tool"]
    texts = [r if isinstance(r, str) else "".join(p.get("text", "") for p in r) for r in results]
    assert [t.strip() for t in texts] == ["hello", "6"]
