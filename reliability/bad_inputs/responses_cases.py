"""OpenAI Responses requests as Codex CLI sends them, served or refused in OpenAI's error shape."""

from __future__ import annotations

from typing import Any

# Short local names: each row of the tables below states its expected answer with one of them.
from reliability.bad_inputs.http_case import HttpCase, HttpExpect
from reliability.bad_inputs.http_case import openai_error as oa


def responses_cases(model: str) -> list[HttpCase]:
    """OpenAI Responses as Codex CLI sends it (tests/harnesses/captured/codex*.jsonl), cut to fit the corpus's
    small model: its tool shapes and Responses options now served (200), and what the gateway cannot serve
    refused in OpenAI's error shape, naming the field."""
    path = "/v1/responses"

    def c(id_: str, klass: str, what: str, expect: HttpExpect, body: Any) -> HttpCase:
        return HttpCase(f"openai.responses.{id_}", "openai", klass, what, path, expect, body)

    def text(role: str, words: str) -> dict[str, Any]:
        return {"type": "message", "role": role, "content": [{"type": "input_text", "text": words}]}

    turn = [text("developer", "Be brief."), text("user", "hi")]

    def req(**fields: Any) -> dict[str, Any]:
        # Codex's options on every request: no max_output_tokens (the corpus caps it to keep calls short).
        return {"model": model, "input": turn, "max_output_tokens": 2, "stream": False, "store": False,
                "include": ["reasoning.encrypted_content"], "prompt_cache_key": "corpus-session",
                "reasoning": {"summary": "auto"}, "tool_choice": "auto", "parallel_tool_calls": True, **fields}

    fn = {"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
    spawn = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}, "strict": False}
    exec_js = {"type": "custom", "name": "exec", "description": "Run JavaScript.",
               "format": {"type": "grammar", "syntax": "lark", "definition": "start: /(.|\\n)+/"}}
    namespace = {"type": "namespace", "name": "multi_agent_v1", "description": "Agents.", "tools": [spawn]}
    replayed = [*turn, {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Plan."}],
                        "content": None, "encrypted_content": "opaque"},
                {"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "call_1",
                 "name": "exec", "input": "text(1)"},
                {"type": "custom_tool_call_output", "call_id": "call_1",
                 "output": [{"type": "input_text", "text": "Script completed\n"}, {"type": "input_text", "text": "1"}]},
                {"type": "function_call", "id": "fc_2", "status": "completed", "call_id": "call_2",
                 "name": "spawn_agent", "namespace": "multi_agent_v1", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_2", "output": "spawned"}]
    return [
        c("codex.namespace", "harness shape", "a namespace tool (Codex's multi_agent_v1): its functions rendered "
          "as multi_agent_v1.<name>, calls mapped back", oa(200), req(tools=[fn, namespace])),
        c("codex.web_search", "harness shape", "Codex's hosted web_search tool: left out of the prompt and listed "
          "in the record (ignored_by_upstream.omitted_hosted_tools)", oa(200),
          req(tools=[fn, {"type": "web_search", "external_web_access": False}])),
        c("codex.custom_grammar", "harness shape", "tools in an additional_tools input item, a custom tool with a "
          "lark grammar (shown, not enforced: recorded), text.verbosity, parallel_tool_calls false", oa(200),
          req(input=[{"type": "additional_tools", "id": "at_1", "role": "developer", "tools": [
              {"type": "namespace", "name": "functions", "description": "", "tools": [exec_js]}]}, *turn],
              text={"verbosity": "low"}, parallel_tool_calls=False)),
        c("codex.replayed_turn", "harness shape", "a turn sent back as Codex does: reasoning with encrypted_content "
          "and content null, a custom_tool_call, its output as input_text parts, a namespaced function_call",
          oa(200), req(input=replayed, tools=[{"type": "namespace", "name": "functions", "tools": [exec_js]},
                                                namespace])),
        c("max_output_tokens.huge", "max_tokens too large", "max_output_tokens 128000: served with what fits",
          oa(200), req(max_output_tokens=128_000)),
        c("tools.local_shell", "bad tool schema", "local_shell (a tool the client runs in the model's own "
          "format): refused", oa(400, param="tools.1.type", contains="'local_shell' is not supported"),
          req(tools=[fn, {"type": "local_shell"}])),
        c("tools.file_search", "bad tool schema", "hosted file_search (the gateway cannot run it)",
          oa(400, param="tools.0.type", contains="cannot run hosted tools"),
          req(tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}])),
        c("tools.unknown_type", "bad tool schema", "tool type 'retrieval'", oa(400, param="tools.0.type"),
          req(tools=[{"type": "retrieval"}])),
        c("tools.hosted_in_namespace", "bad tool schema", "a hosted tool inside a namespace",
          oa(400, param="tools.0.tools.1.type"),
          req(tools=[{"type": "namespace", "name": "x", "tools": [spawn, {"type": "code_interpreter"}]}])),
        c("tools.namespaced_twice", "bad tool schema", "two tools rendering to one name",
          oa(400, param="tools.1.tools.0.name", contains="declared twice"), req(tools=[namespace, namespace])),
        c("tools.custom_no_name", "bad tool schema", "custom tool without a name",
          oa(400, contains="tools.0.custom.name"), req(tools=[{"type": "custom"}])),
        c("input.custom_call_no_input", "bad tool schema", "custom_tool_call item without input",
          oa(400, contains="custom_tool_call.input"),
          req(input=[*turn, {"type": "custom_tool_call", "call_id": "call_1", "name": "exec"}])),
        c("input.image", "bad role", "input_image part (text-only model)",
          oa(400, param="input.1.content.0.type", contains="'input_image' is not supported"),
          req(input=[turn[0], {"type": "message", "role": "user", "content": [
              {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}])),
        c("input.item_reference", "bad role", "item_reference (needs stored responses)",
          oa(400, param="input.2.type"), req(input=[*turn, {"type": "item_reference", "id": "msg_1"}])),
        c("previous_response_id", "unsupported parameter", "previous_response_id (the gateway stores no "
          "responses)", oa(400, "unsupported_parameter", "previous_response_id"),
          req(previous_response_id="resp_1")),
        c("text.json_schema", "unsupported parameter", "text.format json_schema (output cannot be constrained)",
          oa(400, param="text.format.type"),
          req(text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}})),
    ]
