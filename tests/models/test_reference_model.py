"""What the demo relies on: the built model calls the lookup tool for the asked key, but answers with the
tool result only part of the time, so online RL has a reward to find and room to improve."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from models.reference.task import LOOKUP_TOOL, TASK_KEYS, TASK_VALUES, lookup_call, task_messages
from producers.rendering import ChatRenderer
from producers.upstreams.base import GenerateRequest, Sampling
from producers.upstreams.embedded.engine import EmbeddedEngine


def test_first_calls_are_lookup_calls_for_the_asked_key(model_dir: Path, renderer: ChatRenderer) -> None:
    engine = EmbeddedEngine(model_dir)
    keys = [TASK_KEYS[i % len(TASK_KEYS)] for i in range(16)]
    requests = [GenerateRequest(renderer.render(task_messages(key, i), [LOOKUP_TOOL]),
                                Sampling(temperature=1.0, max_tokens=40, seed=i), f"q{i}")
                for i, key in enumerate(keys)]

    async def run() -> list[list[int]]:
        try:
            return [r.output_ids for r in await asyncio.gather(*(engine.generate(q) for q in requests))]
        finally:
            await engine.close()

    outputs = asyncio.run(run())
    calls = [renderer.parse(ids).tool_calls for ids in outputs]
    well_formed = [c[0] for c in calls if len(c) == 1 and c[0].name == "lookup"]
    assert len(well_formed) >= 14, [renderer.output_text(ids) for ids in outputs]
    right_key = sum(json.loads(call.arguments).get("key") == key
                    for call, key in zip([c[0] if c else None for c in calls], keys, strict=True) if call)
    assert right_key >= 11


def test_answers_copy_the_tool_result_only_sometimes(model_dir: Path, renderer: ChatRenderer) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    copy_probability = []
    for i, key in enumerate(TASK_KEYS):
        value = TASK_VALUES[(3 * i + 1) % len(TASK_VALUES)]
        messages = [*task_messages(key, i), lookup_call(key), {"role": "tool", "tool_call_id": "call_0",
                                                               "content": value}]
        prompt = renderer.render(messages, [LOOKUP_TOOL])
        with torch.no_grad():
            probs = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1], -1)
        values = [renderer.encode(v)[0] for v in TASK_VALUES]
        assert float(probs[values].sum()) > 0.9  # it answers with one of the value words
        copy_probability.append(float(probs[renderer.encode(value)[0]]))
    mean = sum(copy_probability) / len(copy_probability)
    assert 1 / len(TASK_VALUES) < mean < 0.7, copy_probability
