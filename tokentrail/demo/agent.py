"""A black-box agent harness: the official ``openai`` SDK, pointed at the gateway by base URL only.

One rollout = one attempt: ask the question, run any tool call the model makes, report the tool
result to the gateway as environment evidence, ask again with the result, and finish.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import openai

from producers.sdk import Rollout
from tokentrail.demo.environment import LookupTask

MAX_TURNS = 3


@dataclass
class RolloutOutcome:
    rollout_id: str
    group_id: str
    calls: int
    answered: str
    correct: bool


def run_rollout(gateway_url: str, model: str, task: LookupTask, group_id: str, group_size: int,
                max_tokens: int = 24, temperature: float = 1.0) -> RolloutOutcome:
    with Rollout(gateway_url, task_input=task.task_input(), group_id=group_id,
                 expected_group_size=group_size, metadata={"harness": "openai-sdk", "task": "lookup"}) as rollout:
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key=rollout.api_key, max_retries=0,
                               timeout=120.0)
        messages: list[dict[str, Any]] = task.first_messages()
        answer, calls = "", 0
        for _turn in range(MAX_TURNS):
            reply = client.chat.completions.create(model=model, messages=messages, tools=task.tools,
                                                   max_tokens=max_tokens, temperature=temperature)
            calls += 1
            message = reply.choices[0].message
            if not message.tool_calls:
                answer = (message.content or "").strip()
                break
            messages.append({"role": "assistant", "content": message.content,
                             "tool_calls": [tc.model_dump() for tc in message.tool_calls]})
            for tool_call in message.tool_calls:
                result = task.run_tool(tool_call.function.name, tool_call.function.arguments)
                rollout.event("TOOL_RESULT", {"tool": tool_call.function.name,
                                              "arguments": tool_call.function.arguments, "result": result},
                              name=tool_call.function.name, call_index=calls - 1)
                messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": result})
        rollout.finish("SUCCESS", final_artifacts={"answer": answer})
        return RolloutOutcome(rollout.rollout_id, group_id, calls, answer,
                              answer.strip().lower() == task.answer)


def describe(outcome: RolloutOutcome) -> str:
    return json.dumps({"rollout": outcome.rollout_id, "answer": outcome.answered, "ok": outcome.correct})
