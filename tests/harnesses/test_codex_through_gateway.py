"""Codex CLI, unchanged, through the real gateway (issue 18, items 4 and 7): ``codex exec`` on a custom
Responses provider (the rollout's root, the harness model variant's name), in a throwaway HOME/CODEX_HOME and
working directory, does a task of three calls with two real shell-tool runs (``exec_command``); every call it
made is on Kafka token-exact and the attempt assembles into a COMPLETE rollout.

Codex posts ``/v1/responses`` with its ``namespace`` tool group (``multi_agent_v1``), a hosted ``web_search``
tool, ``reasoning``, ``include``, ``store: false``, ``prompt_cache_key`` and ``client_metadata``: all accepted,
the request recorded as sent, the omitted web_search listed in the record. The model's output is scripted
(POST /v1/rollouts ``script``; the records say ``scripted``), the rest is real: the harness, its tool runs, the
gateway's rendering, tokenizing, parsing and recording.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from processors.assembler import RolloutAssembly
from producers.gateway.body import validate
from producers.gateway.models_responses import ResponsesRequest
from producers.gateway.responses_adapter import to_internal
from producers.gateway.testing import running_embedded_gateway
from producers.gateway.text_side import ModelTextSide
from producers.sdk import Rollout
from producers.upstreams.embedded.engine import EmbeddedEngine
from schemas.codec import get_codec
from tests.harnesses.harnesses import CODEX_QUIET_TOML, HARNESSES
from tests.producers.gateway.helpers import output_of, prompts_of, read_records
from tokentrail.commands.harness_codex import QUIET_TOML, codex_command
from tokentrail.settings import Settings

pytestmark = pytest.mark.kafka

WRITE = "echo hello > hi.txt && cat hi.txt"
COUNT = "wc -c < hi.txt"
TASK = "Create hi.txt containing hello with a shell command, count its bytes, then answer."


def _exec_command(command: str) -> str:
    return f'<tool_call>\n{{"name": "exec_command", "arguments": {json.dumps({"cmd": command})}}}\n</tool_call>'


SCRIPT = [_exec_command(WRITE), _exec_command(COUNT), "hi.txt says hello, in 6 bytes."]


def test_the_check_quiets_codex_as_the_tests_do() -> None:
    assert QUIET_TOML == CODEX_QUIET_TOML


def test_codex_does_a_tool_task_through_the_gateway_and_every_call_is_recorded_token_exact(
        kafka_bootstrap: str, tokentrail_settings: Settings, harness_model_dir: Path,
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    topics = {"calls_topic": new_topic(partitions=1), "env_topic": new_topic(partitions=1)}
    served = tokentrail_settings.model.harness_name
    settings = tokentrail_settings.model_copy(
        update={"model": tokentrail_settings.model.model_copy(update={"name": served})})
    text = ModelTextSide.from_dir(harness_model_dir)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    codex = HARNESSES["codex"]
    with (running_embedded_gateway(settings, spool_dir=tmp_path / "spool", topics=topics, text=text,
                                   upstream=EmbeddedEngine(harness_model_dir)) as gw,
          Rollout(gw.url, task_input={"file": "hi.txt"}, script=SCRIPT) as rollout):
        argv, extra = codex_command(rollout.anthropic_base_url, rollout.api_key, home, work, served, TASK,
                                    codex=str(codex.binary))
        done = subprocess.run(argv, cwd=work, env=codex.env(home, extra), capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
        finished = rollout.finish("SUCCESS", {"answer": done.stdout.strip()})
    assert done.stdout.strip().endswith(SCRIPT[-1]), done.stdout[-2000:]  # the answer Codex received
    assert (work / "hi.txt").read_text() == "hello\n"  # Codex really ran the first command...
    assert "6" in done.stderr  # ...and the second (its output, `6`, is in Codex's exec log)
    assert finished["call_count"] == 3

    calls = sorted((r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 3)),
                   key=lambda r: r["call_index"])
    assert [(c["status"], c["scripted"], c["protocol"], c["streamed"]) for c in calls] == [
        ("OK", True, "openai.responses", True)] * 3
    for call, prompt in zip(calls, prompts_of(calls), strict=True):
        body = json.loads(call["request_json"])["body"]
        # Recorded as sent: Codex's namespace tool group and hosted web_search, its Responses options.
        assert {t["type"] for t in body["tools"]} >= {"function", "namespace", "web_search"}
        assert body["store"] is False and "prompt_cache_key" in body and "include" in body
        extra = json.loads(call["sampling"]["extra_json"])
        assert extra["ignored_by_upstream"]["omitted_hosted_tools"] == [
            t for t in body["tools"] if t["type"] == "web_search"]
        # The recorded prompt is what the recorded tokenizer and template make of the request Codex sent.
        internal = to_internal(validate(ResponsesRequest, body), 10**6)
        assert any(t["function"]["name"].startswith("multi_agent_v1.") for t in internal.tools or [])
        assert text.renderer.decode(prompt.tolist()) == text.render_text(internal.messages, internal.tools)
        if call["spliced_outputs"] == 0:
            assert prompt.tolist() == text.renderer.render(internal.messages, internal.tools)
        ids, logprobs = output_of(call)
        assert text.decode(ids.tolist()) == SCRIPT[call["call_index"]] and len(logprobs) == len(ids)
        assert np.isfinite(logprobs).all() and (logprobs <= 0).all()
    # Codex sends back each call's items as received: the next call's input holds them, then the tool output.
    second = json.loads(calls[1]["request_json"])["body"]["input"]
    (call_item,) = [i for i in second if i.get("type") == "function_call"]
    assert call_item["name"] == "exec_command" and json.loads(call_item["arguments"]) == {"cmd": WRITE}
    (output_item,) = [i for i in second if i.get("type") == "function_call_output"]
    assert output_item["call_id"] == call_item["call_id"] and "hello" in output_item["output"]
    assert 5_000 < calls[0]["prompt"]["length"] < calls[1]["prompt"]["length"] < calls[2]["prompt"]["length"]

    env_records = [(name, r) for name, r in read_records(tokentrail_settings, topics["env_topic"], 2)]
    state = RolloutAssembly(rollout.rollout_id)
    emitted = [r for name, rec in [*env_records, *(("CallRecord", c) for c in calls)]
               for r in state.accept(name, rec).rollouts]
    (completed,) = emitted
    assert completed["status"] == "COMPLETE" and len(completed["calls"]) == 3
    get_codec().encode("CompletedRollout", completed)


JS = 'const r = await tools.exec_command({cmd: "echo hello > hi.txt && cat hi.txt"});\ntext(r);\n'
FREEFORM_SCRIPT = [f'<tool_call>\n{{"name": "functions.exec", "arguments": {json.dumps({"input": JS})}}}\n</tool_call>',
                   "done: hi.txt says hello"]


def test_codex_on_its_default_model_runs_its_freeform_exec_through_the_gateway(
        kafka_bootstrap: str, tokentrail_settings: Settings, harness_model_dir: Path,
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    """No ``model`` in the config: Codex picks its catalog default and sends its tools in an ``additional_tools``
    item, with the freeform JavaScript ``exec`` (a custom tool in namespace ``functions``). The model's call goes
    back as a ``custom_tool_call``; Codex runs the script (which runs the shell command) and sends the call back,
    and the second prompt extends the first prompt and output token for token."""
    topics = {"calls_topic": new_topic(partitions=1), "env_topic": new_topic(partitions=1)}
    served = tokentrail_settings.model.harness_name
    settings = tokentrail_settings.model_copy(
        update={"model": tokentrail_settings.model.model_copy(update={"name": served})})
    text = ModelTextSide.from_dir(harness_model_dir)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    codex = HARNESSES["codex"]
    with (running_embedded_gateway(settings, spool_dir=tmp_path / "spool", topics=topics, text=text,
                                   upstream=EmbeddedEngine(harness_model_dir), model_aliases={"*": served}) as gw,
          Rollout(gw.url, task_input={"file": "hi.txt"}, script=FREEFORM_SCRIPT) as rollout):
        argv, extra = codex_command(rollout.anthropic_base_url, rollout.api_key, home, work, served,
                                    "Create hi.txt containing hello with a shell command, then answer done.",
                                    codex=str(codex.binary))
        config = home / ".codex" / "config.toml"
        config.write_text("".join(line for line in config.read_text().splitlines(keepends=True)
                                  if not line.startswith("model = ")))
        done = subprocess.run(argv, cwd=work, env=codex.env(home, extra), capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
        finished = rollout.finish("SUCCESS", {"answer": done.stdout.strip()})
    assert done.stdout.strip().endswith(FREEFORM_SCRIPT[-1]), done.stdout[-2000:]
    assert (work / "hi.txt").read_text() == "hello\n"  # Codex ran the script, which ran the command
    assert finished["call_count"] == 2

    calls = sorted((r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 2)),
                   key=lambda r: r["call_index"])
    assert [(c["status"], c["protocol"]) for c in calls] == [("OK", "openai.responses")] * 2
    bodies = [json.loads(c["request_json"])["body"] for c in calls]
    assert bodies[0]["model"] != served and "tools" not in bodies[0]
    assert bodies[0]["input"][0]["type"] == "additional_tools"
    (sent_back,) = [i for i in bodies[1]["input"] if i.get("type") == "custom_tool_call"]
    assert (sent_back["name"], sent_back["input"]) == ("exec", JS)
    prompts = prompts_of(calls)
    for call, prompt, body in zip(calls, prompts, bodies, strict=True):
        internal = to_internal(validate(ResponsesRequest, body), 10**6)
        assert text.renderer.decode(prompt.tolist()) == text.render_text(internal.messages, internal.tools)
        extra_json = json.loads(call["sampling"]["extra_json"])["ignored_by_upstream"]
        assert extra_json["unenforced_tool_formats"] == ["functions.exec"]
    before = np.concatenate([prompts[0], output_of(calls[0])[0]])
    assert np.array_equal(prompts[1][:len(before)], before) and not calls[1]["prefix_breaks"]
