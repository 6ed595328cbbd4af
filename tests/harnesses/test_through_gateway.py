"""A real harness, unchanged, through the real gateway (issue 18): Pi runs headless against a rollout's
base URL on the embedded engine, does a task of three calls with two real shell-tool executions, and
every call it made is on Kafka token-exact; the attempt assembles into a COMPLETE rollout.

The tiny reference model cannot choose a harness's tools by itself, so the rollout is scripted (POST
/v1/rollouts ``script``): the engine emits the given tool calls token by token, with the model's own
logprobs, and the records say ``scripted`` (nothing trains on them). Everything else is real: the
harness's requests, its tool executions, the gateway's rendering, tokenizing, parsing and recording.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from models.reference.build import build_model
from processors.assembler import RolloutAssembly
from producers.gateway.body import validate
from producers.gateway.models_openai import ChatCompletionRequest
from producers.gateway.openai_adapter import chat_to_internal
from producers.gateway.testing import running_embedded_gateway
from producers.gateway.text_side import ModelTextSide
from producers.sdk import Rollout
from schemas.codec import get_codec
from tests.harnesses.capture import _pi
from tests.producers.gateway.helpers import output_of, prompts_of, read_records
from tokentrail.settings import Settings

pytestmark = pytest.mark.kafka

WRITE = "echo hello > hi.txt && cat hi.txt"
COUNT = "wc -c < hi.txt"
SCRIPT = [
    f'<tool_call>\n{{"name": "bash", "arguments": {{"command": {json.dumps(WRITE)}}}}}\n</tool_call>',
    f'<tool_call>\n{{"name": "bash", "arguments": {{"command": {json.dumps(COUNT)}}}}}\n</tool_call>',
    "hi.txt says hello, in 6 bytes.",
]


def test_pi_does_a_tool_task_through_the_gateway_and_every_call_is_recorded_token_exact(
        kafka_bootstrap: str, tokentrail_settings: Settings, new_topic: Callable[..., str], tmp_path: Path) -> None:
    topics = {"calls_topic": new_topic(partitions=1), "env_topic": new_topic(partitions=1)}
    text = ModelTextSide.from_dir(build_model(tokentrail_settings.model.dir))
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    with (running_embedded_gateway(tokentrail_settings, spool_dir=tmp_path / "spool", topics=topics, text=text,
                                   model_aliases={"*": tokentrail_settings.model.name}) as gw,
          Rollout(gw.url, task_input={"file": "hi.txt"}, script=SCRIPT) as rollout):
        command, env = _pi(rollout.openai_base_url.removesuffix("/v1"), home, work,
                           "Create hi.txt containing hello with a shell command, count its bytes, then answer.",
                           True)
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        finished = rollout.finish("SUCCESS", {"answer": done.stdout.strip()})
    assert (work / "hi.txt").read_text() == "hello\n"  # Pi really ran both commands
    assert "hi.txt says hello, in 6 bytes." in done.stdout
    assert finished["call_count"] == 3

    calls = sorted((r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 3)),
                   key=lambda r: r["call_index"])
    assert [(c["status"], c["scripted"], c["protocol"], c["streamed"]) for c in calls] == [
        ("OK", True, "openai.chat", True)] * 3
    for call, prompt in zip(calls, prompts_of(calls), strict=True):
        # The recorded prompt is what the recorded tokenizer and template make of the request Pi sent.
        body = json.loads(call["request_json"])["body"]
        internal = chat_to_internal(validate(ChatCompletionRequest, body), 10**6)
        assert text.renderer.decode(prompt.tolist()) == text.render_text(internal.messages, internal.tools)
        if call["spliced_outputs"] == 0:
            assert prompt.tolist() == text.renderer.render(internal.messages, internal.tools)
        # Pi asked for 16384 output tokens; it was served what fits, and the record keeps both numbers.
        extra = json.loads(call["sampling"]["extra_json"])
        assert extra["requested_max_tokens"] == 16384 and call["sampling"]["max_tokens"] < 16384
        # The output ids decode to the scripted completion the harness received.
        ids, logprobs = output_of(call)
        assert text.decode(ids.tolist()) == SCRIPT[call["call_index"]] and len(logprobs) == len(ids)
        assert np.isfinite(logprobs).all() and (logprobs <= 0).all()
    # The later calls extend the earlier ones: Pi resends the conversation, the prompt grows.
    assert calls[1]["prompt"]["length"] > calls[0]["prompt"]["length"]

    # Downstream: the attempt's records assemble into a COMPLETE rollout (the processors' own core).
    env = [(name, r) for name, r in read_records(tokentrail_settings, topics["env_topic"], 2)]
    state = RolloutAssembly(rollout.rollout_id)
    emitted = [r for name, rec in [*env, *(("CallRecord", c) for c in calls)]
               for r in state.accept(name, rec).rollouts]
    (completed,) = emitted
    assert completed["status"] == "COMPLETE" and len(completed["calls"]) == 3
    assert all(c["scripted"] for c in completed["calls"])
    get_codec().encode("CompletedRollout", completed)
