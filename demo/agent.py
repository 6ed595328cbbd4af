"""A black-box agent harness: the official ``openai`` SDK, pointed at the gateway by base URL only.

One rollout = one attempt: ask the question, run any tool call the model makes, report the tool
result to the gateway as environment evidence, ask again with the result, and finish.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai

from demo.environment import LookupTask
from producers.sdk import Rollout

MAX_TURNS = 3


@dataclass
class RolloutOutcome:
    rollout_id: str
    group_id: str
    calls: int
    answered: str
    correct: bool


def converse(client: openai.OpenAI, model: str, task: LookupTask, *, max_tokens: int = 24,
             temperature: float = 1.0, user: str | None = None,
             on_tool_result: Callable[[Any, str, int], None] | None = None,
             note: str | None = None) -> tuple[str, list[str]]:
    """The agent's loop (both demos' agents): ask the question, run any tool call the model makes (the agent runs
    its tool itself), ask again with the result, for at most MAX_TURNS calls. Returns the answer and the
    response id of each call; ``on_tool_result(tool_call, result, call_index)`` sees every tool result."""
    messages: list[dict[str, Any]] = task.first_messages()
    if note is not None:  # something of the user's own (the forgetting demo's canary), after the question
        messages.append({"role": "user", "content": note})
    answer, response_ids = "", []
    extra = {"user": user} if user is not None else {}
    for _turn in range(MAX_TURNS):
        reply = client.chat.completions.create(model=model, messages=messages, tools=task.tools,
                                               max_tokens=max_tokens, temperature=temperature, **extra)
        response_ids.append(reply.id)
        message = reply.choices[0].message
        if not message.tool_calls:
            answer = (message.content or "").strip()
            break
        messages.append({"role": "assistant", "content": message.content,
                         "tool_calls": [tc.model_dump() for tc in message.tool_calls]})
        for tool_call in message.tool_calls:
            result = task.run_tool(tool_call.function.name, tool_call.function.arguments)
            if on_tool_result is not None:
                on_tool_result(tool_call, result, len(response_ids) - 1)
            messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": result})
    return answer, response_ids


def run_rollout(gateway_url: str, model: str, task: LookupTask, group_id: str, group_size: int,
                max_tokens: int = 24, temperature: float = 1.0) -> RolloutOutcome:
    with Rollout(gateway_url, task_input=task.task_input(), group_id=group_id,
                 expected_group_size=group_size, metadata={"harness": "openai-sdk", "task": "lookup"}) as rollout:
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key=rollout.api_key, max_retries=0,
                               timeout=120.0)

        def report(tool_call: Any, result: str, call_index: int) -> None:  # environment evidence
            rollout.event("TOOL_RESULT", {"tool": tool_call.function.name,
                                          "arguments": tool_call.function.arguments, "result": result},
                          name=tool_call.function.name, call_index=call_index)

        answer, response_ids = converse(client, model, task, max_tokens=max_tokens, temperature=temperature,
                                        on_tool_result=report)
        rollout.finish("SUCCESS", final_artifacts={"answer": answer})
        return RolloutOutcome(rollout.rollout_id, group_id, len(response_ids), answer,
                              answer.strip().lower() == task.answer)


def describe(outcome: RolloutOutcome) -> str:
    return json.dumps({"rollout": outcome.rollout_id, "answer": outcome.answered, "ok": outcome.correct})
