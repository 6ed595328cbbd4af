"""Print what each captured harness run sent, call by call: the facts tests/harnesses/captured/README.md gives.

``python -m tests.harnesses.summarize [tests/harnesses/captured/claude.jsonl ...]`` (default: every capture).
For each call: method, path and query; the headers that identify the harness, session and protocol
options; the body's top-level fields with their values (long ones as sizes); the model and output-token
cap; the tools (count, types, names, namespaces); the prompt's size in characters (system/instructions
and messages/input); and the kinds of items in the conversation.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

CAPTURED = Path(__file__).resolve().parent / "captured"
# Headers that say nothing about the harness (transport) are left out.
BORING = {"host", "content-length", "connection", "accept-encoding", "content-type", "accept"}
SHORT = 160


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False))


def tool_summary(tools: Any) -> list[str]:
    out = []
    for tool in tools if isinstance(tools, list) else []:
        kind = tool.get("type", "(no type)")
        name = tool.get("name") or (tool.get("function") or {}).get("name") or ""
        extra = ""
        if kind == "namespace":
            extra = "[" + ", ".join(f"{t.get('type')}:{t.get('name')}" for t in tool.get("tools", [])) + "]"
        if kind == "custom":
            extra = f"(format {json.dumps(tool.get('format', {}).get('type'))})"
        if tool.get("cache_control"):
            extra += f" cache_control={json.dumps(tool['cache_control'])}"
        if tool.get("defer_loading"):
            extra += " defer_loading"
        out.append(f"{kind}:{name}{extra}")
    return out


def conversation_items(body: dict[str, Any]) -> Counter[str]:
    kinds: Counter[str] = Counter()
    for m in body.get("messages") or []:
        content = m.get("content")
        parts = [c.get("type", "?") for c in content] if isinstance(content, list) else ["str"]
        kinds.update(f"{m.get('role')}:{p}" for p in parts)
        if m.get("tool_calls"):
            kinds.update(f"{m.get('role')}:tool_calls" for _ in m["tool_calls"])
    for item in body.get("input") if isinstance(body.get("input"), list) else []:
        kinds[f"{item.get('type')}{':' + item['role'] if item.get('role') else ''}"] += 1
    return kinds


def prompt_chars(body: dict[str, Any]) -> dict[str, int]:
    sizes = {}
    for key in ("system", "instructions", "messages", "input", "tools"):
        if key in body:
            value = body[key]
            if key == "system" and isinstance(value, list):
                sizes["system_text"] = sum(len(b.get("text", "")) for b in value)
            elif key in ("messages", "input") and isinstance(value, list):
                sizes[f"{key}_text"] = sum(_text_len(m) for m in value)
            sizes[f"{key}_json"] = _size(value)
    return sizes


def _text_len(item: Any) -> int:
    if isinstance(item, str):
        return len(item)
    if isinstance(item, list):
        return sum(_text_len(x) for x in item)
    if isinstance(item, dict):
        return sum(_text_len(v) for k, v in item.items() if k in ("content", "text", "output", "arguments", "input"))
    return 0


def describe(record: dict[str, Any]) -> list[str]:
    body = record.get("body") if isinstance(record.get("body"), dict) else {}
    query = f"?{record['query']}" if record.get("query") else ""
    lines = [f"#{record['seq']} {record['method']} {record['path']}{query}  ({record.get('body_bytes', 0)} bytes)"]
    headers = {k: v for k, v in record["headers"].items() if k not in BORING}
    lines.append("  headers: " + json.dumps(headers))
    fields = {}
    for key, value in body.items():
        fields[key] = value if _size(value) <= SHORT else f"<{type(value).__name__} {_size(value)} chars>"
    lines.append("  body: " + json.dumps(fields, ensure_ascii=False))
    if "tools" in body or any(i.get("type") == "additional_tools" for i in body.get("input") or []
                              if isinstance(i, dict)):
        tools = body.get("tools") or []
        nested = [t for i in body.get("input") or [] if isinstance(i, dict) and i.get("type") == "additional_tools"
                  for t in i.get("tools", [])]
        lines.append(f"  tools ({len(tools)}): " + ", ".join(tool_summary(tools)))
        if nested:
            lines.append(f"  additional_tools in input ({len(nested)}): " + ", ".join(tool_summary(nested)))
    if isinstance(body.get("system"), list):
        lines.append("  system blocks: " + json.dumps([{k: (v if k != "text" else f"<{len(v)} chars: "
                                                             f"{v[:40]!r}...>") for k, v in b.items()}
                                                        for b in body["system"]], ensure_ascii=False))
    lines.append("  prompt chars: " + json.dumps(prompt_chars(body)))
    lines.append("  conversation: " + json.dumps(dict(conversation_items(body))))
    return lines


def main(argv: list[str] | None = None) -> None:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])] or sorted(CAPTURED.glob("*.jsonl"))
    for path in paths:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        print(f"== {path.name}: {len(records)} calls")
        for record in records:
            print("\n".join(describe(record)))
        print()


if __name__ == "__main__":
    main()
