"""Codex CLI, unchanged, through the real gateway (issue 18, items 4 and 7): ``codex exec`` on a custom
Responses provider (the rollout's root, the harness model variant's name), in a throwaway HOME/CODEX_HOME and
working directory, does a task of three calls with two real shell-tool runs (``exec_command``); every call it
made is on Kafka token-exact and the attempt assembles into a COMPLETE rollout. That run is the shared
``tokentrail harnesses check`` run (``harnesses_check``); this file asserts what is Codex's own in its records,
and runs Codex once more on its default catalog model (its freeform ``exec``).

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
from producers.gateway.text_side import ModelTextSide
from producers.sdk import Rollout
from producers.upstreams.embedded.engine import EmbeddedEngine
from schemas.codec import get_codec
from testkit.gateway import running_embedded_gateway
from tests.harnesses.check_run import CheckRun
from tests.harnesses.harnesses import CODEX_QUIET_TOML, HARNESSES
from tests.producers.gateway.helpers import output_of, prompts_of, read_records
from tokentrail.commands.harness_codex import QUIET_TOML, codex_command
from tokentrail.commands.harnesses import COUNT, WRITE
from tokentrail.commands.harnesses import HARNESSES as CHECK_HARNESSES
from tokentrail.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def test_the_check_quiets_codex_as_the_tests_do() -> None:
    """One copy of the switches, and they turn off everything that would leave the machine."""
    import tomllib

    assert QUIET_TOML is CODEX_QUIET_TOML
    quiet = tomllib.loads(QUIET_TOML)
    assert quiet["check_for_update_on_startup"] is False
    assert quiet["analytics"]["enabled"] is False and quiet["feedback"]["enabled"] is False
    assert quiet["features"] == {"plugins": False, "remote_plugin": False}
    assert set(quiet["otel"].values()) == {"none"}


def test_codex_requests_tool_runs_and_outputs_as_recorded(harnesses_check: CheckRun) -> None:
    row = harnesses_check.row("codex")
    assert row["passed"], row["reason"]
    # Codex sends every item back as received: each call's prompt extends the last one's prompt and output.
    assert row["routes"] == ["POST /v1/responses"] and row["spliced_calls"] == 2 and row["break_causes"] == []
    calls, env = harnesses_check.records("codex")
    assert [(c["status"], c["scripted"], c["protocol"], c["streamed"]) for c in calls] == [
        ("OK", True, "openai.responses", True)] * 3
    text = ModelTextSide.from_dir(harnesses_check.settings.model.harness_dir)
    script = CHECK_HARNESSES["codex"].script
    for call, prompt in zip(calls, prompts_of(calls), strict=True):
        body = json.loads(call["request_json"])["body"]
        # Recorded as sent: Codex's namespace tool group and hosted web_search, its Responses options.
        assert {t["type"] for t in body["tools"]} >= {"function", "namespace", "web_search"}
        assert body["store"] is False and "prompt_cache_key" in body and "include" in body
        extra = json.loads(call["sampling"]["extra_json"])
        assert extra["ignored_by_upstream"]["omitted_hosted_tools"] == [
            t for t in body["tools"] if t["type"] == "web_search"]
        internal = to_internal(validate(ResponsesRequest, body), 10**6)
        assert any(t["function"]["name"].startswith("multi_agent_v1.") for t in internal.tools or [])
        assert text.renderer.decode(prompt.tolist()) == text.render_text(internal.messages, internal.tools)
        ids, logprobs = output_of(call)
        assert text.decode(ids.tolist()) == script[call["call_index"]] and len(logprobs) == len(ids)
        assert np.isfinite(logprobs).all() and (logprobs <= 0).all()
    # The calls and the real runs' results, as Codex sent them back: the command, then what it printed.
    last = json.loads(calls[2]["request_json"])["body"]["input"]
    sent = [i for i in last if i.get("type") == "function_call"]
    assert [json.loads(i["arguments"]) for i in sent] == [{"cmd": WRITE}, {"cmd": COUNT}]
    results = [i["output"] for i in last if i.get("type") == "function_call_output"]
    assert [i["call_id"] for i in last if i.get("type") == "function_call_output"] == [i["call_id"] for i in sent]
    assert results[0].endswith("Output:\nhello\n") and results[1].endswith("Output:\n6\n"), results
    assert 5_000 < calls[0]["prompt"]["length"] < calls[1]["prompt"]["length"] < calls[2]["prompt"]["length"]
    state = RolloutAssembly(row["rollout_id"])
    (completed,) = [r for name, rec in [*env, *(("CallRecord", c) for c in calls)]
                    for r in state.accept(name, rec).rollouts]
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
