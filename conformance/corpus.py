"""The conformance corpus: multi-turn agent conversations with scripted model outputs (issue 28, item 4).

Each conversation is a list of steps: what the harness appends before a model call (a user turn; the tool
results of the previous call's tool calls), and what the model answers (reasoning, text, tool calls). The
outputs are kept as structure here; ``formats.py`` writes them in each family's own output format, and the
request a harness would send at every call is built by ``requests`` the way the harnesses do it: the assistant
turn echoed back with its tool calls' arguments re-serialized compactly (``JSON.stringify``, as Pi, Codex and
OpenClaw do), reasoning echoed back or not, tool results as consecutive ``tool`` messages.

What it covers, because each is a place where renderers, parsers and splicing are known to go wrong:
tool calls after reasoning, parallel tool calls and the consecutive tool messages that answer them, a tool
error and the retry, non-ASCII text and arguments, long JSON arguments (nested, quotes, newlines,
backslashes), and a compaction (the harness replaces the history by a summary: a prefix break by design).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

Message = dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Output:
    """What the model says at one call."""

    content: str = ""
    reasoning: str | None = None
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class Step:
    output: Output
    before: tuple[Message, ...] = ()  # user turns the harness adds before this call
    results: tuple[str, ...] = ()  # the tool results the harness sends for this output's calls, in order
    compact: bool = False  # the harness replaced the history before this call by a summary (``before``)


@dataclass(frozen=True)
class Conversation:
    name: str
    system: str
    tools: tuple[dict[str, Any], ...]
    steps: tuple[Step, ...]
    echo_reasoning: bool = False  # whether the harness sends reasoning back (``reasoning_content``)
    covers: tuple[str, ...] = field(default=())


def _tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in properties.items()},
                       "required": list(properties)}}}


BASH = _tool("bash", "Run a shell command in the workspace and return its output.", command="string")
READ = _tool("read_file", "Read a file of the workspace.", path="string")
WRITE = _tool("write_file", "Write a file of the workspace.", path="string", content="string")
EDIT = _tool("apply_edits", "Apply structured edits to files.", edits="array", dry_run="boolean")
SYSTEM = "You are a coding agent. Use the tools to inspect and change the workspace; answer briefly."

PYTEST_OUTPUT = ("============================= test session starts ==============================\n"
                 "collected 12 items\n\ntests/test_app.py ...........F\n\n"
                 "FAILED tests/test_app.py::test_total - assert 41 == 42\n1 failed, 11 passed in 0.31s")
APP_PY = "def total(items):\n    return sum(i.price for i in items[1:])\n"
LONG_EDITS = [
    {"path": "src/app.py", "old": "items[1:]", "new": "items",
     "note": 'the slice "[1:]" skipped the first item; see C:\\work\\notes.txt'},
    {"path": "docs/CHANGELOG.md", "old": "", "new": "## 0.4.1\n- total() counts every item (was: all but the first)\n"
     "- 合計の計算を修正しました\n", "note": "tabs\tand\nnewlines"},
    {"path": "config/settings.json", "old": '{"retries": 3}',
     "new": json.dumps({"retries": 5, "backoff": {"base_ms": 250, "max_ms": 8000, "jitter": True},
                        "hosts": [f"node-{i}.internal" for i in range(8)], "unicode": "naïve café ✓"}),
     "note": None},
]


CONVERSATIONS: tuple[Conversation, ...] = (
    Conversation(
        "tool_calls_with_reasoning", SYSTEM, (BASH, READ), echo_reasoning=True,
        covers=("reasoning before tool calls", "reasoning echoed back", "multi-turn"),
        steps=(
            Step(Output(reasoning="The user wants the failing test fixed. First run the tests to see which fails.",
                        calls=(ToolCall("bash", {"command": "pytest -x -q"}),)),
                 before=({"role": "user", "content": "The test suite fails. Find out why and fix it."},),
                 results=(PYTEST_OUTPUT,)),
            Step(Output(reasoning="test_total is off by one item. Read src/app.py.",
                        content="test_total fails; reading the code.",
                        calls=(ToolCall("read_file", {"path": "src/app.py"}),)),
                 results=(APP_PY,)),
            Step(Output(reasoning="The slice items[1:] skips the first item.",
                        content="`total()` skips the first item (`items[1:]`); it should sum `items`.")),
            Step(Output(reasoning="A new question; answer directly.", content="Yes: run `pytest -q` again."),
                 before=({"role": "user", "content": "Will the suite pass after that change?"},)),
        )),
    Conversation(
        "parallel_calls_consecutive_tool_messages", SYSTEM, (READ, BASH),
        covers=("parallel tool calls", "consecutive tool messages", "reasoning not echoed back"),
        steps=(
            Step(Output(reasoning="Read both files at once.",
                        calls=(ToolCall("read_file", {"path": "README.md"}),
                               ToolCall("read_file", {"path": "pyproject.toml"}),
                               ToolCall("bash", {"command": "git log --oneline -3"}))),
                 before=({"role": "user", "content": "Summarise the project from its README and pyproject."},),
                 results=("# demo\nA small demo project.", '[project]\nname = "demo"\nversion = "0.4.0"',
                          "a1b2c3d fix total\n9f8e7d6 add tests\n0000001 init")),
            Step(Output(reasoning="I have all three.", content="`demo` 0.4.0: a small demo project; 3 commits.")),
        )),
    Conversation(
        "tool_error_non_ascii", SYSTEM, (WRITE, BASH),
        covers=("non-ASCII text and arguments", "a tool error and the retry"),
        steps=(
            Step(Output(reasoning="写一个日语问候文件。",
                        calls=(ToolCall("write_file", {"path": "/etc/挨拶.txt", "content": "こんにちは、世界 🌏\n"}),)),
                 before=({"role": "user", "content": "请写一个文件 挨拶.txt，内容是「こんにちは、世界 🌏」。"},),
                 results=("Error: permission denied: '/etc/挨拶.txt' (errno 13)",)),
            Step(Output(reasoning="权限不足，写到工作目录。",
                        calls=(ToolCall("write_file", {"path": "挨拶.txt", "content": "こんにちは、世界 🌏\n"}),)),
                 results=("wrote 31 bytes",)),
            Step(Output(reasoning="完成。", content="已写入 `挨拶.txt`（31 字节）：こんにちは、世界 🌏")),
        )),
    Conversation(
        "long_json_arguments", SYSTEM, (EDIT,),
        covers=("long nested JSON arguments", "quotes, backslashes, tabs and newlines in arguments"),
        steps=(
            Step(Output(reasoning="Apply the three edits in one call.",
                        calls=(ToolCall("apply_edits", {"edits": LONG_EDITS, "dry_run": False}),)),
                 before=({"role": "user", "content": "Fix total(), note it in the changelog and raise retries."},),
                 results=(json.dumps({"applied": 3, "files": [e["path"] for e in LONG_EDITS]}),)),
            Step(Output(reasoning="Done.", content="Applied 3 edits.")),
        )),
    Conversation(
        "compaction", SYSTEM, (BASH,),
        covers=("a compaction: the history replaced by a summary (a prefix break by design)",),
        steps=(
            Step(Output(reasoning="List the files.", calls=(ToolCall("bash", {"command": "ls"}),)),
                 before=({"role": "user", "content": "What is in this directory?"},),
                 results=("README.md\nsrc\ntests",)),
            Step(Output(reasoning="Answer.", content="README.md, src/ and tests/.")),
            Step(Output(reasoning="Count the tests.", calls=(ToolCall("bash", {"command": "ls tests | wc -l"}),)),
                 before=({"role": "user", "content": "[Summary of the conversation so far] The directory holds "
                                                     "README.md, src/ and tests/."},
                         {"role": "user", "content": "How many test files are there?"}),
                 results=("4",), compact=True),
            Step(Output(reasoning="Four.", content="There are 4 test files.")),
        )),
)


@dataclass(frozen=True)
class Capabilities:
    """What a family's output format can say: the corpus is adapted to it, never the format to the corpus."""

    reasoning: bool = True
    parallel_calls: bool = True
    content_with_calls: bool = True


def adapted(conversation: Conversation, can: Capabilities) -> Conversation:
    """The conversation as a model of a family with these capabilities would have it: no reasoning where the
    format has none, parallel calls made one per turn where it has none, no text beside a tool call where the
    format carries only the call."""
    steps: list[Step] = []
    for step in conversation.steps:
        out = step.output
        if not can.reasoning:
            out = replace(out, reasoning=None)
        if out.calls and not can.content_with_calls:
            out = replace(out, content="")
        if len(out.calls) > 1 and not can.parallel_calls:
            for k, (call, result) in enumerate(zip(out.calls, step.results, strict=True)):
                first = k == 0
                steps.append(Step(replace(out, calls=(call,), reasoning=out.reasoning if first else None,
                                          content=out.content if first else ""),
                                  before=step.before if first else (), results=(result,),
                                  compact=step.compact and first))
            continue
        steps.append(replace(step, output=out))
    return replace(conversation, steps=tuple(steps))


def call_id(conversation: str, step: int, k: int) -> str:
    return f"call_{conversation[:12]}_{step}_{k}"


def compact_json(value: Any) -> str:
    """Arguments as a JavaScript harness re-serializes them (``JSON.stringify``)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def assistant_message(conversation: Conversation, index: int, out: Output) -> Message:
    """The assistant turn as the harness sends it back on the next call."""
    message: Message = {"role": "assistant", "content": out.content or None}
    if out.reasoning and conversation.echo_reasoning:
        message["reasoning_content"] = out.reasoning
    if out.calls:
        message["tool_calls"] = [{"id": call_id(conversation.name, index, k), "type": "function",
                                  "function": {"name": c.name, "arguments": compact_json(c.arguments)}}
                                 for k, c in enumerate(out.calls)]
    return message


def requests(conversation: Conversation) -> list[list[Message]]:
    """The messages of every call of the conversation, as the harness sends them."""
    history: list[Message] = [{"role": "system", "content": conversation.system}]
    out: list[list[Message]] = []
    for i, step in enumerate(conversation.steps):
        if step.compact:
            history = [{"role": "system", "content": conversation.system}]
        history = [*history, *step.before]
        out.append(list(history))
        history.append(assistant_message(conversation, i, step.output))
        history += [{"role": "tool", "tool_call_id": call_id(conversation.name, i, k), "content": result}
                    for k, result in enumerate(step.results)]
    return out
