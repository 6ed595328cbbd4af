"""The capture server answers each protocol in a shape the official SDKs accept, and records every call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.harnesses.capture_server import REDACTED, CaptureServer, Refusal, Reply, ToolCall, has_tool_results

pytestmark = pytest.mark.e2e


class Scripted:
    """Replies given in order by the test, then "hello there"."""

    def __init__(self) -> None:
        self.queue: list[Reply] = []

    def __call__(self, record: dict) -> Reply:
        return self.queue.pop(0) if self.queue else "hello there"


@pytest.fixture
def script() -> Scripted:
    return Scripted()


@pytest.fixture
def server(tmp_path: Path, script: Scripted) -> Iterator[CaptureServer]:
    with CaptureServer(tmp_path / "calls.jsonl", reply_for=script) as s:
        yield s


def test_anthropic_stream_and_json(server: CaptureServer, script: Scripted) -> None:
    client = anthropic.Anthropic(base_url=server.base_url, auth_token="secret-token", max_retries=0)
    with client.messages.stream(model="m", max_tokens=64000, messages=[{"role": "user", "content": "hi"}]) as s:
        text = s.get_final_text()
        final = s.get_final_message()
    assert text == "hello there" and final.stop_reason == "end_turn"
    script.queue = [ToolCall("Bash", {"command": "ls"})]
    with client.messages.stream(model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "tool_use" and final.content[0].input == {"command": "ls"}
    plain = client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert plain.content[0].text == "hello there"
    count = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "x"}])
    assert count.input_tokens > 0
    records = server.records
    assert [r["path"] for r in records] == ["/v1/messages"] * 3 + ["/v1/messages/count_tokens"]
    assert records[0]["headers"]["authorization"] == f"Bearer {REDACTED}"
    assert "secret-token" not in Path(server.recorder.path).read_text()
    assert records[0]["body"]["max_tokens"] == 64000
    assert records[1]["reply"]["stop_reason"] == "tool_use"
    assert records[1]["reply"]["content"][0]["input"] == {"command": "ls"}
    assert records[3]["reply"]["input_tokens"] == count.input_tokens


def test_openai_responses_stream(server: CaptureServer, script: Scripted) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="sk-secret", max_retries=0)
    with client.responses.stream(model="m", input="hi") as s:
        final = s.get_final_response()
    assert final.output_text == "hello there" and final.usage and final.usage.total_tokens > 0
    script.queue = [ToolCall("exec_command", {"cmd": "ls"}),
                    ToolCall("apply_patch", "*** Begin Patch\n*** End Patch\n", custom=True)]
    with client.responses.stream(model="m", input="x") as s:
        call = s.get_final_response().output[0]
    assert call.type == "function_call" and json.loads(call.arguments) == {"cmd": "ls"}
    with client.responses.stream(model="m", input="x") as s:
        custom = s.get_final_response().output[0]
    assert custom.type == "custom_tool_call" and custom.input.startswith("*** Begin Patch")
    plain = client.responses.create(model="m", input="x")
    assert plain.output_text == "hello there"
    assert "sk-secret" not in Path(server.recorder.path).read_text()


def test_openai_chat_stream_with_usage(server: CaptureServer, script: Scripted) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="sk-secret", max_retries=0)
    chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello there"
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens > 0
    script.queue = [ToolCall("bash", {"command": "ls"})]
    chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True))
    args = "".join(c.choices[0].delta.tool_calls[0].function.arguments or ""
                   for c in chunks if c.choices and c.choices[0].delta.tool_calls)
    assert json.loads(args) == {"command": "ls"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    plain = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert plain.choices[0].message.content == "hello there"


def test_models_refusals_and_unknown_routes_are_recorded(server: CaptureServer, script: Scripted) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="k", max_retries=0)
    client.chat.completions.create(model="seen-model", messages=[{"role": "user", "content": "x"}])
    assert {"capture-model", "seen-model"} <= {m.id for m in client.models.list()}
    script.queue = [Refusal(400, "max_tokens too large")]
    with pytest.raises(openai.BadRequestError, match="max_tokens too large"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert httpx.head(f"{server.base_url}/api/hello").status_code == 404
    assert [(r["method"], r["path"]) for r in server.records][-1] == ("HEAD", "/api/hello")
    lines = Path(server.recorder.path).read_text().splitlines()
    assert len(lines) == len(server.records) and all(json.loads(line)["seq"] == i for i, line in enumerate(lines))


def test_reasoning_parts_when_asked(tmp_path: Path) -> None:
    with CaptureServer(tmp_path / "calls.jsonl", reasoning="thinking it over") as server:
        claude = anthropic.Anthropic(base_url=server.base_url, api_key="k", max_retries=0)
        with claude.messages.stream(model="m", max_tokens=2000, messages=[{"role": "user", "content": "x"}],
                                    thinking={"type": "enabled", "budget_tokens": 1024}) as s:
            final = s.get_final_message()
        assert [b.type for b in final.content] == ["thinking", "text"]
        assert final.content[0].thinking == "thinking it over" and final.content[0].signature
        plain = claude.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}])
        assert [b.type for b in plain.content] == ["text"]  # no thinking asked, none sent
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="k", max_retries=0)
        with client.responses.stream(model="m", input="x", reasoning={"summary": "auto"}) as s:
            response = s.get_final_response()
        assert [o.type for o in response.output] == ["reasoning", "message"]
        assert response.output[0].summary[0].text == "thinking it over"
        assert response.output[0].encrypted_content and response.output_text == "hi"


@pytest.mark.parametrize("body, expected", [
    ({"messages": [{"role": "user", "content": "x"}]}, False),
    ({"messages": [{"role": "tool", "content": "out", "tool_call_id": "c"}]}, True),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}, True),
    ({"input": [{"type": "message", "role": "user", "content": "x"}]}, False),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "o"}]}, True),
    ({"input": [{"type": "custom_tool_call_output", "call_id": "c", "output": "o"}]}, True),
])
def test_has_tool_results(body: dict, expected: bool) -> None:
    assert has_tool_results(body) is expected
