"""The demo environment: a key-value lookup task with one tool.

The user asks for the value of a key; the ``lookup`` tool returns it from a table that is drawn per
task, so the only way to answer right is to read the tool result. The table values are single tokens
of the demo model's vocabulary (``models.reference.task``), so a small model can learn to copy them.
Pure and deterministic given the task seed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from models.reference.task import LOOKUP_TOOL, TASK_KEYS, TASK_VALUES, task_messages


@dataclass(frozen=True)
class LookupTask:
    task_id: str
    key: str
    table: dict[str, str]
    variant: int

    @property
    def answer(self) -> str:
        return self.table[self.key]

    def task_input(self) -> dict[str, Any]:
        """What the gateway records as the rollout's task input; the verifier reads ``answer``."""
        return {"task_id": self.task_id, "key": self.key, "answer": self.answer, "variant": self.variant}

    def first_messages(self) -> list[dict[str, Any]]:
        return task_messages(self.key, self.variant)

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [LOOKUP_TOOL]

    def run_tool(self, name: str, arguments: str) -> str:
        """Execute a tool call the model made; a malformed call gets an error string, as a real tool would."""
        if name != "lookup":
            return f"error: unknown tool {name!r}"
        try:
            key = json.loads(arguments or "{}").get("key")
        except (json.JSONDecodeError, AttributeError):
            return "error: arguments are not a JSON object"
        if key not in self.table:
            return f"error: no key {key!r}"
        return self.table[key]


def make_task(seed: int) -> LookupTask:
    rng = random.Random(seed)
    values = list(TASK_VALUES)
    rng.shuffle(values)
    table = dict(zip(TASK_KEYS, values, strict=False))
    return LookupTask(task_id=f"lookup-{seed}", key=rng.choice(TASK_KEYS), table=table,
                      variant=rng.randrange(3))
