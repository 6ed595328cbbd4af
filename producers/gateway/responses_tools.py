"""Responses tools -> the chat form's function tools, and the model's tool calls back -> Responses items.

Chat templates know one kind of tool, a function with JSON arguments; the Responses API has more:

- ``function``: as is (``strict`` included, as vLLM hands it to the template: ``chat.function_tool``).
- ``namespace`` (a named group of tools, Codex's ``multi_agent_v1``): each tool in it is rendered as a
  function named ``<namespace>.<name>``; a call of that name goes back as an item with ``name`` and
  ``namespace`` apart, and a call item sent with a ``namespace`` renders under the joined name again, so
  the mapping is reversible and a conversation re-renders as the model wrote it.
- ``custom`` (freeform: the model writes one string, e.g. Codex's JavaScript ``exec``): a function with one
  string parameter ``input`` whose description states the tool's format; calls go back as
  ``custom_tool_call`` items with that string as ``input``. A grammar is shown to the model, not enforced
  (the gateway cannot constrain sampling): the call record says so (``unenforced_tool_formats``).
- ``web_search`` (a hosted tool, which Codex declares on every request): the gateway cannot search, so it is
  left out of the prompt and the call record lists it (``omitted_hosted_tools``); the model cannot call it.
- any other type (other hosted tools, ``local_shell``, unknown ones): refused, naming the type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from producers.gateway.chat import Tool, ToolCallOut, function_tool
from producers.gateway.errors import bad_request
from producers.gateway.models_responses import CustomTool, FunctionTool, NamespaceTool

NAMESPACE_SEPARATOR = "."
CUSTOM_INPUT = "input"  # the one parameter of a custom tool rendered as a function
OMITTED_HOSTED_TOOLS = frozenset({"web_search", "web_search_preview"})
TOOL_CALL_PREFIX = "call_"


@dataclass(frozen=True)
class ToolTarget:
    """What a rendered function name stands for in the request's own terms."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None = None


@dataclass
class ToolSet:
    functions: list[Tool] = field(default_factory=list)  # chat form, in declaration order
    targets: dict[str, ToolTarget] = field(default_factory=dict)  # rendered name -> target
    omitted: list[dict[str, Any]] = field(default_factory=list)  # hosted tools left out, as sent
    unenforced_formats: list[str] = field(default_factory=list)  # rendered names of grammar-format tools
    # bare tool name -> its one rendered name, or None when several namespaces declare it: built as tools are
    # added, so resolving a call item is one lookup (a scan per item was quadratic in a hostile request)
    by_bare_name: dict[str, str | None] = field(default_factory=dict)


def rendered_name(name: str, namespace: str | None) -> str:
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def _format_text(fmt: dict[str, Any] | None) -> str:
    if not fmt or fmt.get("type", "text") == "text":
        return "Free-form text input."
    if fmt.get("type") == "grammar":
        return (f"Free-form text input in this {fmt.get('syntax', '')} grammar:\n"
                f"{fmt.get('definition', '')}")
    return f"Free-form text input in this format: {json.dumps(fmt, sort_keys=True)}"


def _add(tools: ToolSet, tool: Any, namespace: str | None, where: str) -> None:
    name = rendered_name(tool.name, namespace)
    if name in tools.targets:
        raise bad_request(f"tool name {name!r} is declared twice", param=f"{where}.name")
    tools.by_bare_name[tool.name] = None if tool.name in tools.by_bare_name else name
    if isinstance(tool, FunctionTool):
        tools.functions.append(function_tool(name, tool.description, tool.parameters, tool.strict,
                                                   tool.defer_loading))
        tools.targets[name] = ToolTarget("function", tool.name, namespace)
        return
    parameters = {"type": "object", "properties": {CUSTOM_INPUT: {"type": "string",
                                                                  "description": _format_text(tool.format)}},
                  "required": [CUSTOM_INPUT], "additionalProperties": False}
    tools.functions.append(function_tool(name, tool.description, parameters))
    tools.targets[name] = ToolTarget("custom", tool.name, namespace)
    if tool.format and tool.format.get("type", "text") != "text":
        tools.unenforced_formats.append(name)


def _refuse(kind: str, where: str) -> None:
    raise bad_request(f"tool type {kind!r} is not supported: this gateway serves function, custom and namespace "
                      f"tools (web_search is left out of the prompt and recorded); it cannot run hosted tools",
                      param=f"{where}.type")


def tool_set(declared: list[tuple[Any, str]]) -> ToolSet:
    """The tools of a request, each with where it was declared (``tools.4``, ``input.0.tools.1``)."""
    tools = ToolSet()
    for tool, where in declared:
        if isinstance(tool, FunctionTool | CustomTool):
            _add(tools, tool, None, where)
        elif isinstance(tool, NamespaceTool):
            if NAMESPACE_SEPARATOR in tool.name:
                raise bad_request(f"namespace {tool.name!r} contains {NAMESPACE_SEPARATOR!r}",
                                  param=f"{where}.name")
            for j, inner in enumerate(tool.tools):
                if not isinstance(inner, FunctionTool | CustomTool):
                    _refuse(inner.type, f"{where}.tools.{j}")
                _add(tools, inner, tool.name, f"{where}.tools.{j}")
        elif tool.type in OMITTED_HOSTED_TOOLS:
            tools.omitted.append(tool.model_dump(exclude_none=True))
        else:
            _refuse(tool.type, where)
    return tools


# ------------------------------------------------------------------------------ calls in the conversation

def call_name(name: str, namespace: str | None, tools: ToolSet) -> str:
    """The rendered name of a call item sent back: joined with its namespace; a call sent without one whose
    name is not a top-level tool but exactly one namespaced tool's (Codex drops the namespace ``functions``
    on its own calls) renders as that tool, so the model sees the name it was given. One dict lookup each."""
    if namespace or name in tools.targets:
        return rendered_name(name, namespace)
    return tools.by_bare_name.get(name) or name


def function_call_of(name: str, arguments: str) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def custom_call_of(name: str, text: str) -> dict[str, Any]:
    # json.dumps' default separators are what models write (and what _custom_input reads back).
    return {"name": name, "arguments": json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)}


# ---------------------------------------------------------------------------------- calls in the output

def _custom_input(arguments: str) -> str:
    """The string a custom call carries: ``input`` of the model's JSON arguments, else the text as written."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and list(parsed) == [CUSTOM_INPUT] and isinstance(parsed[CUSTOM_INPUT], str):
        return parsed[CUSTOM_INPUT]
    return arguments


def call_item(call: ToolCallOut, targets: dict[str, ToolTarget]) -> dict[str, Any]:
    """One output item for a tool call the model made: function_call or custom_tool_call, namespaced as declared.

    A name the request did not declare goes back as a plain function call, as the model wrote it."""
    suffix = call.id.removeprefix(TOOL_CALL_PREFIX)
    target = targets.get(call.name, ToolTarget("function", call.name))
    if target.kind == "custom":
        item = {"id": f"ctc_{suffix}", "type": "custom_tool_call", "call_id": call.id, "name": target.name,
                "input": _custom_input(call.arguments), "status": "completed"}
    else:
        item = {"id": f"fc_{suffix}", "type": "function_call", "call_id": call.id, "name": target.name,
                "arguments": call.arguments, "status": "completed"}
    if target.namespace:
        item["namespace"] = target.namespace
    return item
