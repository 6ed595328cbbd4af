"""Claude Code, unchanged, through the real gateway (issue 18, items 2 and 5): ``claude -p`` on the harness
model variant (its ~49 K-character prompt fits the 64 K context), its model name mapped to the served model,
does a task of three calls with two real Bash executions; every call it made is on Kafka token-exact and the
attempt assembles into a COMPLETE rollout.

Claude Code posts ``/v1/messages?beta=true`` with its ``anthropic-beta`` list, ``thinking``, ``metadata``,
``cache_control`` blocks and a role "system" message inside ``messages``: all accepted, the request recorded
as sent. The model's output is scripted (POST /v1/rollouts ``script``; the records say ``scripted``), the
rest is real: the harness, its tool runs, the gateway's rendering, tokenizing, parsing and recording.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from processors.assembler import RolloutAssembly
from producers.gateway.anthropic_adapter import conversation
from producers.gateway.body import validate
from producers.gateway.models_anthropic import MessagesRequest
from producers.gateway.testing import running_embedded_gateway
from producers.gateway.text_side import ModelTextSide
from producers.sdk import Rollout
from producers.upstreams.embedded.engine import EmbeddedEngine
from schemas.codec import get_codec
from tests.harnesses.capture import _claude
from tests.producers.gateway.helpers import output_of, prompts_of, read_records
from tokentrail.settings import Settings

pytestmark = pytest.mark.kafka

WRITE = "echo hello > hi.txt && cat hi.txt"
COUNT = "wc -c < hi.txt"


def _bash(command: str, why: str) -> str:
    arguments = json.dumps({"command": command, "description": why})
    return f'<tool_call>\n{{"name": "Bash", "arguments": {arguments}}}\n</tool_call>'


SCRIPT = [_bash(WRITE, "Write hi.txt"), _bash(COUNT, "Count its bytes"), "hi.txt says hello, in 6 bytes."]


def test_claude_code_does_a_tool_task_through_the_gateway_and_every_call_is_recorded_token_exact(
        kafka_bootstrap: str, tokentrail_settings: Settings, harness_model_dir: Path,
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    topics = {"calls_topic": new_topic(partitions=1), "env_topic": new_topic(partitions=1)}
    served = tokentrail_settings.model.harness_name
    # Only the served name changes: model.dir stays the demo's, which the wiring would rebuild as the tiny model.
    settings = tokentrail_settings.model_copy(
        update={"model": tokentrail_settings.model.model_copy(update={"name": served})})
    text = ModelTextSide.from_dir(harness_model_dir)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    with (running_embedded_gateway(settings, spool_dir=tmp_path / "spool", topics=topics, text=text,
                                   upstream=EmbeddedEngine(harness_model_dir), model_aliases={"*": served}) as gw,
          Rollout(gw.url, task_input={"file": "hi.txt"}, script=SCRIPT) as rollout):
        command, env = _claude(rollout.anthropic_base_url, home, work,
                               "Create hi.txt containing hello with a shell command, count its bytes, then answer.",
                               True)
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
        finished = rollout.finish("SUCCESS", {"answer": done.stdout.strip()})
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["result"] == SCRIPT[-1], result
    assert (work / "hi.txt").read_text() == "hello\n"  # Claude Code really ran both commands
    assert finished["call_count"] == 3

    calls = sorted((r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 3)),
                   key=lambda r: r["call_index"])
    assert [(c["status"], c["scripted"], c["protocol"], c["streamed"]) for c in calls] == [
        ("OK", True, "anthropic.messages", True)] * 3
    for call, prompt in zip(calls, prompts_of(calls), strict=True):
        request = json.loads(call["request_json"])
        body = request["body"]
        # Recorded as sent: the name Claude Code asked for (served by the mapped model), thinking, metadata.
        assert body["model"].startswith("claude-") and body["model"] != served
        assert "thinking" in body and "metadata" in body and body["max_tokens"] > 4096
        # The recorded prompt is what the recorded tokenizer and template make of the request Claude Code sent.
        messages, tools = conversation(validate(MessagesRequest, body))
        assert text.renderer.decode(prompt.tolist()) == text.render_text(messages, tools)
        if call["spliced_outputs"] == 0:
            assert prompt.tolist() == text.renderer.render(messages, tools)
        extra = json.loads(call["sampling"]["extra_json"])
        assert extra["requested_max_tokens"] == body["max_tokens"] > call["sampling"]["max_tokens"]
        ids, logprobs = output_of(call)
        assert text.decode(ids.tolist()) == SCRIPT[call["call_index"]] and len(logprobs) == len(ids)
        assert np.isfinite(logprobs).all() and (logprobs <= 0).all()
    assert 5_000 < calls[0]["prompt"]["length"] < calls[1]["prompt"]["length"] < calls[2]["prompt"]["length"]

    env_records = [(name, r) for name, r in read_records(tokentrail_settings, topics["env_topic"], 2)]
    state = RolloutAssembly(rollout.rollout_id)
    emitted = [r for name, rec in [*env_records, *(("CallRecord", c) for c in calls)]
               for r in state.accept(name, rec).rollouts]
    (completed,) = emitted
    assert completed["status"] == "COMPLETE" and len(completed["calls"]) == 3
    get_codec().encode("CompletedRollout", completed)
