"""Format warm-up of the reference model: a short supervised run on the toy lookup task.

A model with random weights cannot emit a parseable tool call, so online RL on a tool task would never
see a reward. The warm-up gives the model what a pretrained base model brings: the chat and tool-call
format, the habit of calling ``lookup`` with the key it was asked about, and an attention path from the
answer to the tool result. It then deliberately leaves that last habit weak, so there is something
for RL to learn:

* phase 1 (``warmup_copy_phase`` of the steps): short dialogues (no system turn, no tool listing, so
  steps are cheap and copying is learnt quickly) whose answer is always the tool result;
* phase 2: half the steps on the full prompt (system turn with the tool listing), answers copy the
  tool result only with probability ``warmup_late_copy``, otherwise they are a random value.

The loss covers exactly the sampled parts of each dialogue (both assistant outputs, each ending in
``<|im_end|>``), as the engine would produce them. Deterministic: seeded data, seeded init, one thread.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from producers.model_build import (
    EOS_TOKEN,
    LOOKUP_TOOL,
    QUESTION_TEMPLATES,
    TASK_KEYS,
    TASK_VALUES,
    BuildSpec,
    task_dialogue,
)

Example = tuple[list[int], list[int]]  # (ids, loss mask)
POOL_SIZE = 384  # distinct dialogues per (prompt form, copy probability)


def warm_up(spec: BuildSpec, model: Any, tokenizer: Any, progress: Callable[[str], None]) -> float:
    """Train ``model`` in place; returns the last step's loss (NaN when ``warmup_steps`` is 0)."""
    import torch

    if spec.warmup_steps <= 0:
        return float("nan")
    rng = random.Random(spec.seed + 1)
    copy_steps = int(spec.warmup_steps * spec.warmup_copy_phase)
    pools = {
        "copy-short": _examples(tokenizer, rng, system=False, copy_probability=1.0),
        "late-short": _examples(tokenizer, rng, system=False, copy_probability=spec.warmup_late_copy),
        "late-full": _examples(tokenizer, rng, system=True, copy_probability=spec.warmup_late_copy),
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.warmup_lr, weight_decay=0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same reductions on every run
    model.train()
    loss_value = float("nan")
    try:
        for step in range(spec.warmup_steps):
            phase = "copy" if step < copy_steps else "dilute"
            pool = pools["copy-short" if phase == "copy" else ("late-full" if step % 2 == 0 else "late-short")]
            batch = [pool[rng.randrange(len(pool))] for _ in range(spec.warmup_batch)]
            loss_value = _step(model, optimizer, batch, tokenizer.pad_token_id)
            if step % 50 == 0 or step == spec.warmup_steps - 1:
                progress(f"  warm-up step {step + 1}/{spec.warmup_steps} ({phase})  loss {loss_value:.3f}")
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return loss_value


def _step(model: Any, optimizer: Any, batch: list[Example], pad_id: int) -> float:
    import torch

    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.float32)
    for row, (seq, loss_mask) in enumerate(batch):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = torch.tensor(loss_mask, dtype=torch.float32)
    logits = model(input_ids=ids).logits[:, :-1]
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
    ).view(len(batch), width - 1)
    target = mask[:, 1:]
    loss = (nll * target).sum() / target.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _examples(tokenizer: Any, rng: random.Random, system: bool, copy_probability: float) -> list[Example]:
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    tools = [LOOKUP_TOOL] if system else None
    examples: list[Example] = []
    for _ in range(POOL_SIZE):
        key, value = rng.choice(TASK_KEYS), rng.choice(TASK_VALUES)
        answer = value if rng.random() < copy_probability else rng.choice(TASK_VALUES)
        messages = task_dialogue(key, value, answer, rng.randrange(len(QUESTION_TEMPLATES)), system=system)
        head = 2 if system else 1
        prompt1 = _render(tokenizer, messages[:head], tools)
        prompt2 = _render(tokenizer, messages[: head + 2], tools)
        full = _render(tokenizer, messages, tools, generation_prompt=False)
        if full[: len(prompt2)] != prompt2 or prompt2[: len(prompt1)] != prompt1:
            raise RuntimeError("a warm-up dialogue does not extend its own prompts; check the template")
        call_end = prompt2.index(eos, len(prompt1)) + 1  # each output ends with its <|im_end|>
        answer_end = full.index(eos, len(prompt2)) + 1
        ids = full[:answer_end]
        mask = [0] * len(ids)
        for start, end in ((len(prompt1), call_end), (len(prompt2), answer_end)):
            mask[start:end] = [1] * (end - start)
        examples.append((ids, mask))
    return examples


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            generation_prompt: bool = True) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                              tokenize=True, return_dict=False))
