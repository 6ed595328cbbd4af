"""The demo's toy lookup task: the words it uses, its system prompt and questions, the ``lookup`` tool, and
the messages of a task call and of a whole dialogue. The reference model is built for it (its tokenizer keeps
the task words single tokens, its warm-up trains on these dialogues) and the demo environment poses it."""

from __future__ import annotations

import json
from typing import Any

# Words a demo task can use; each is a single token wherever the task puts it (asserted at build time).
TASK_KEYS = ("fox", "owl", "cat", "dog", "bee", "cow", "elk", "yak")
TASK_VALUES = ("red", "blue", "green", "gold", "pink", "gray", "black", "white")
TASK_SYSTEM_PROMPT = "Answer in one word."
LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up the value of a key.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        },
    },
}
# The key is quoted so that it is the same bare token in the question and in the call's JSON.
QUESTION_TEMPLATES = (
    'What is "{key}"?',
    'Look up "{key}".',
    'Find the value of "{key}".',
)


def task_question(key: str, variant: int = 0) -> str:
    return QUESTION_TEMPLATES[variant % len(QUESTION_TEMPLATES)].format(key=key)


def lookup_call(key: str, call_id: str = "call_0") -> dict[str, Any]:
    """The assistant message that calls the lookup tool, in OpenAI form."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"key": key})},
            }
        ],
    }


def task_messages(key: str, variant: int = 0) -> list[dict[str, Any]]:
    """The first call's messages of the lookup task (tools: ``[LOOKUP_TOOL]``)."""
    return [
        {"role": "system", "content": TASK_SYSTEM_PROMPT},
        {"role": "user", "content": task_question(key, variant)},
    ]


def task_dialogue(key: str, value: str, answer: str, variant: int = 0,
                  system: bool = True) -> list[dict[str, Any]]:
    """A whole two-call lookup dialogue: question, tool call, tool result ``value``, ``answer``."""
    head = task_messages(key, variant)
    return [
        *(head if system else head[1:]),
        lookup_call(key),
        {"role": "tool", "tool_call_id": "call_0", "content": value},
        {"role": "assistant", "content": answer},
    ]
