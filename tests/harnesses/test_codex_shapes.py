"""What Codex CLI really sends (tests/harnesses/captured/codex*.jsonl, every request of its runs), against the
responses adapter and the real gateway on the harness model (issue 18, item 4), without the binary:

- every captured request converts: its ``namespace`` tools render as ``<namespace>.<name>`` functions, its
  custom (freeform) ``exec`` as a function of one string ``input`` (its lark grammar shown, not enforced,
  and the record says so), the tools of an ``additional_tools`` input item join the tools, the hosted
  ``web_search`` is left out and listed in the record; encrypted reasoning and the options not applied are listed;
- the model's calls go back in Codex's terms (name and namespace apart, ``custom_tool_call`` with its input),
  streamed as valid SDK events, and sent back as Codex does they re-render as the model wrote them;
- a tool type the gateway cannot serve and an image are refused in OpenAI's error shape, naming the field,
  and the attempt goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from models.reference.harness_corpus import CAPTURED_DIR
from producers.gateway.body import validate
from producers.gateway.chat import CallOutcome, ToolCallOut
from producers.gateway.models_responses import ResponsesRequest
from producers.gateway.responses_adapter import ResponseStream, request_tools, to_internal
from producers.gateway.responses_tools import call_item
from producers.gateway.text_side import ModelTextSide
from producers.sdk import Rollout
from schemas.tokens import unpack_ids
from testkit.gateway import running_embedded_gateway
from tests.producers.gateway.helpers import prompts_of, read_records
from tests.producers.gateway.test_responses_api import STREAM_EVENTS
from tokentrail.settings import Settings

pytestmark = pytest.mark.e2e

RUNS = ("codex", "codex-tool", "codex-default-model", "codex-default-model-tool")
SPAWN = {"message": "count the bytes of hi.txt"}
JS = 'const r = await tools.exec_command({cmd: "wc -c < hi.txt"});\ntext(r);\n'


def _captured(run: str) -> list[dict[str, Any]]:
    return [json.loads(line)["body"] for line in (CAPTURED_DIR / f"{run}.jsonl").read_text().splitlines()]


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def test_every_captured_codex_request_converts_with_what_is_not_applied_listed() -> None:
    bodies = {run: _captured(run) for run in RUNS}
    assert [len(b) for b in bodies.values()] == [1, 2, 1, 2]  # every request of each run
    for run, requests in bodies.items():
        for body in requests:
            internal = to_internal(validate(ResponsesRequest, body), 4096)
            names = [t["function"]["name"] for t in internal.tools or []]
            ignored = internal.sampling.ignored
            assert ignored["include"] == ["reasoning.encrypted_content"] and ignored["prompt_cache_key"]
            if run.startswith("codex-default-model"):  # tools only in an additional_tools input item
                assert "tools" not in body and names[:2] == ["functions.exec", "functions.wait"]
                assert "collaboration.spawn_agent" in names and "clock.sleep" in names
                (exec_tool,) = [t["function"] for t in internal.tools or []
                                if t["function"]["name"] == "functions.exec"]
                assert list(exec_tool["parameters"]["properties"]) == ["input"]
                assert "lark" in exec_tool["parameters"]["properties"]["input"]["description"]
                assert ignored["unenforced_tool_formats"] == ["functions.exec"]
                assert ignored["parallel_tool_calls"] is False and ignored["text.verbosity"] == "low"
                assert "omitted_hosted_tools" not in ignored
            else:
                assert "multi_agent_v1.spawn_agent" in names and "exec_command" in names
                assert ignored["omitted_hosted_tools"] == [{"type": "web_search", "external_web_access": False}]
            roles = [m["role"] for m in internal.messages or []]
            assert roles[0] == "system" and roles.count("user") == 2  # developer messages are system turns
            if any(item.get("type") == "reasoning" for item in body["input"]):  # each run's second call
                assert ignored["encrypted_reasoning_items"] == 1 and roles[-2:] == ["assistant", "tool"]
                (call,) = internal.messages[-2]["tool_calls"]
                if run == "codex-default-model-tool":
                    # Sent back without its namespace: rendered as the one namespaced tool of that name.
                    assert call["function"]["name"] == "functions.exec"
                    assert json.loads(call["function"]["arguments"])["input"].startswith("const r = await")
                    assert '"exit_code":0' in internal.messages[-1]["content"]  # the list of parts, joined


def test_namespaced_and_custom_calls_go_back_in_codex_terms_and_re_render_as_written() -> None:
    body = _captured("codex-default-model-tool")[0]
    plain = _captured("codex-tool")[0]
    custom = call_item(ToolCallOut("call_1", "functions.exec", json.dumps({"input": JS})),
                       request_tools(validate(ResponsesRequest, body)).targets)
    assert custom == {"id": "ctc_1", "type": "custom_tool_call", "call_id": "call_1", "name": "exec", "input": JS,
                      "status": "completed", "namespace": "functions"}
    spawn = call_item(ToolCallOut("call_2", "multi_agent_v1.spawn_agent", json.dumps(SPAWN)),
                      request_tools(validate(ResponsesRequest, plain)).targets)
    assert (spawn["type"], spawn["name"], spawn["namespace"]) == ("function_call", "spawn_agent", "multi_agent_v1")
    # Not JSON with one string input: the custom call carries the text as the model wrote it.
    odd = call_item(ToolCallOut("call_3", "functions.exec", "1 + 1"),
                    request_tools(validate(ResponsesRequest, body)).targets)
    assert odd["input"] == "1 + 1"
    # An undeclared name goes back as a plain function call, as written.
    assert call_item(ToolCallOut("call_4", "nope.x", "{}"), {})["name"] == "nope.x"
    for request, item, output in ((body, custom, "custom_tool_call_output"), (plain, spawn, "function_call_output")):
        again = {**request, "input": [*request["input"], item, {"type": output, "call_id": item["call_id"],
                                                                "output": "ok"}]}
        (call,) = to_internal(validate(ResponsesRequest, again), 4096).messages[-2]["tool_calls"]
        name = f"{item['namespace']}.{item['name']}"
        assert call["function"]["name"] == name
        assert json.loads(call["function"]["arguments"]) == ({"input": JS} if item is custom else SPAWN)


def test_codex_calls_stream_as_sdk_events_and_the_completed_response_carries_them() -> None:
    """Every frame of a custom and a namespaced call is a valid ``openai`` SDK stream event (Codex parses the same
    event names); the custom call streams its input as custom_tool_call_input delta/done."""
    req = validate(ResponsesRequest, _captured("codex-default-model-tool")[0])
    calls = [ToolCallOut("call_a", "functions.exec", json.dumps({"input": JS})),
             ToolCallOut("call_b", "collaboration.spawn_agent", json.dumps(SPAWN))]
    outcome = CallOutcome("c1", 0, "m", 1, [1, 2], [3, 4], [-0.1, -0.2], "", "", None, calls, "stop")
    fmt = ResponseStream(req, "c1", 1)
    events = []
    for frame in fmt.start([1, 2]) + fmt.finish(outcome):
        name, data = frame.decode().removesuffix("\n\n").split("\n")
        events.append(STREAM_EVENTS.validate_python(json.loads(data.removeprefix("data: "))))
        assert name == f"event: {events[-1].type}"
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.custom_tool_call_input.delta") == kinds.count(
        "response.function_call_arguments.delta") == 1
    done = [e.item.model_dump() for e in events if e.type == "response.output_item.done"]
    assert [(i["type"], i["name"], i["namespace"]) for i in done] == [
        ("custom_tool_call", "exec", "functions"), ("function_call", "spawn_agent", "collaboration")]
    assert done[0]["input"] == JS and json.loads(done[1]["arguments"]) == SPAWN
    usage = events[-1].response.usage
    assert usage is not None and usage.input_tokens == 2 and usage.output_tokens == 2
    assert [i.model_dump() for i in events[-1].response.output] == done


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    return [json.loads(line.removeprefix("data: ")) for line in response.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.kafka
def test_codex_requests_through_the_gateway_refusals_are_clear_and_a_namespaced_call_comes_back(
        kafka_bootstrap: str, tokentrail_settings: Settings, harness_model_dir: Path,
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    """(Codex's freeform exec and the splice of its call sent back are the real binary's, in
    test_codex_through_gateway.py.)"""
    topics = {"calls_topic": new_topic(partitions=1), "env_topic": new_topic(partitions=1)}
    served = tokentrail_settings.model.harness_name
    settings = tokentrail_settings.model_copy(update={"model": tokentrail_settings.model.model_copy(
        update={"spec": "harness", "dir": harness_model_dir, "name": served})})
    text = ModelTextSide.from_dir(harness_model_dir)
    default_first = _captured("codex-default-model-tool")[0]
    plain_first = _captured("codex-tool")[0]
    script = [_call("multi_agent_v1.spawn_agent", SPAWN)]
    with (running_embedded_gateway(settings, spool_dir=tmp_path / "spool", topics=topics,
                                   model_aliases={"*": served}) as gw,
          Rollout(gw.url, task_input={"harness": "codex"}, script=script) as rollout,
          httpx.Client(base_url=rollout.openai_base_url, timeout=600,
                       headers={"authorization": f"Bearer {rollout.api_key}", "originator": "codex_exec"}) as http):
        # Refused in OpenAI's error shape, naming the field: a tool type the gateway cannot serve (also inside
        # a namespace), an image; nothing is generated for them.
        hosted_inside = {"type": "additional_tools", "tools": [
            {"type": "namespace", "name": "x", "tools": [{"type": "file_search"}]}]}
        refusals = [({**plain_first, "tools": [*plain_first["tools"], {"type": "local_shell"}]}, "tools.9.type",
                     "'local_shell' is not supported"),
                    ({**default_first, "input": [hosted_inside, *default_first["input"][1:]]},
                     "input.0.tools.0.tools.0.type", "'file_search' is not supported"),
                    ({**plain_first, "input": [*plain_first["input"], {"type": "message", "role": "user", "content": [
                        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]},
                     "input.4.content.0.type", "'input_image' is not supported")]
        for body, param, message in refusals:
            refused = http.post("/responses", json=body)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["type"] == "invalid_request_error" and error["param"] == param and message in error["message"]

        # The attempt goes on, on Codex's plain tool set: a call into the multi_agent_v1 namespace comes back
        # namespaced. (Its 19 K characters of developer instructions left out: this call checks the tools.)
        short = {**plain_first, "input": [i for i in plain_first["input"] if i.get("role") != "developer"]}
        events = _events(http.post("/responses", json=short))
        assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
        spawned = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert [(i["type"], i["name"], i.get("namespace"), json.loads(i["arguments"])) for i in spawned] == [
            ("function_call", "spawn_agent", "multi_agent_v1", SPAWN)]
        assert events[-1]["response"]["usage"]["input_tokens"] > 1_000

    (call,) = [r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 1)]
    assert (call["call_index"], call["status"], call["protocol"]) == (0, "OK", "openai.responses")
    (prompt,) = prompts_of([call])
    internal = to_internal(validate(ResponsesRequest, json.loads(call["request_json"])["body"]), 10**6)
    assert text.renderer.decode(prompt.tolist()) == text.render_text(internal.messages, internal.tools)
    assert text.decode(unpack_ids(call["output_ids"]).tolist()) == script[0]
    extra = json.loads(call["sampling"]["extra_json"])["ignored_by_upstream"]
    assert extra["omitted_hosted_tools"] == [{"type": "web_search", "external_web_access": False}]
