"""Format warm-up of the reference model: a short supervised run on the toy lookup task.

A model with random weights cannot emit a parseable tool call, so online RL on a tool task would never
see a reward. The warm-up gives the model what a pretrained base model brings: the chat and tool-call
format, the habit of calling ``lookup`` with the key it was asked about, and an attention path from the
answer to the tool result. It then deliberately leaves that last habit weak, so that RL has something
to learn:

* phase "copy": answers are always the tool result. Most steps use short dialogues (no system turn, no
  tool listing: cheap, and the copy paths form quickly); every third uses the full prompt. The phase
  ends when a probe of full prompts shows both copies (call key, answer) are learnt, or at a step cap.
* phase "dilute": the answer's target is a soft distribution, ``warmup_answer_copy`` on the tool result
  and the rest spread over all values, so the model ends up answering with the tool result about
  that often (plus chance), while keeping the format and the key copy.

The loss covers exactly the sampled parts of each dialogue (both assistant outputs, each ending in
``<|im_end|>``), as the engine would produce them. Deterministic: seeded data, seeded init, one thread.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from models.reference.spec import BuildSpec
from models.reference.task import LOOKUP_TOOL, QUESTION_TEMPLATES, TASK_KEYS, TASK_VALUES, task_dialogue
from models.reference.template import EOS_TOKEN

POOL_SIZE = 384  # distinct dialogues per prompt form
PROBE_EVERY = 25
PROBE_SIZE = 48


@dataclass(frozen=True)
class Example:
    ids: list[int]
    loss_mask: list[int]  # 1 where the id is a sampled token with a hard target
    key_at: int  # index of the call's key id
    answer_at: int  # index of the answer id (its target may be soft)
    value_id: int  # the tool result


@dataclass(frozen=True)
class Probe:
    key: float  # mean probability of the asked key in the call (teacher forced)
    answer: float  # mean probability that the answer is the tool result
    tool_first: float  # mean probability that the first call opens with <tool_call>


def warm_up(spec: BuildSpec, model: Any, tokenizer: Any, progress: Callable[[str], None]) -> float:
    """Train ``model`` in place; returns the last step's loss (NaN when ``warmup_steps`` is 0)."""
    import torch

    if spec.warmup_steps <= 0:
        return float("nan")
    rng = random.Random(spec.seed + 1)
    short = _examples(tokenizer, rng, system=False, count=POOL_SIZE)
    full = _examples(tokenizer, rng, system=True, count=POOL_SIZE)
    probe_set = _examples(tokenizer, rng, system=True, count=PROBE_SIZE)
    value_ids = torch.tensor([tokenizer.convert_tokens_to_ids(v) for v in TASK_VALUES])
    tool_call_id = tokenizer.convert_tokens_to_ids("<tool_call>")
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.warmup_lr, weight_decay=0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same reductions on every run
    loss = float("nan")
    try:
        step = 0
        while step < spec.warmup_steps:  # phase "copy", ends early once the probe passes
            if step % PROBE_EVERY == 0:
                probe = _probe(model, probe_set, tokenizer.pad_token_id, tool_call_id)
                progress(f"  warm-up copy step {step}: loss {loss:.3f}  probe key {probe.key:.2f} "
                         f"answer {probe.answer:.2f} tool-first {probe.tool_first:.2f}")
                if probe.key >= 0.9 and probe.answer >= 0.9 and probe.tool_first >= 0.95:
                    break
            pool = full if step % 3 == 0 else short
            loss = _step(model, optimizer, _batch(rng, pool, spec.warmup_batch), tokenizer.pad_token_id,
                         value_ids, copy=1.0)
            step += 1
        for dilute_step in range(spec.warmup_dilute_steps):
            pool = full if dilute_step % 2 == 0 else short
            loss = _step(model, optimizer, _batch(rng, pool, spec.warmup_batch), tokenizer.pad_token_id,
                         value_ids, copy=spec.warmup_answer_copy)
        probe = _probe(model, probe_set, tokenizer.pad_token_id, tool_call_id)
        progress(f"  warm-up done after {step} + {spec.warmup_dilute_steps} steps: probe key {probe.key:.2f} "
                 f"answer {probe.answer:.2f} tool-first {probe.tool_first:.2f}")
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return loss


def _batch(rng: random.Random, pool: list[Example], size: int) -> list[Example]:
    return [pool[rng.randrange(len(pool))] for _ in range(size)]


def _tensors(batch: list[Example], pad_id: int) -> tuple[Any, Any]:
    import torch

    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.float32)
    for row, example in enumerate(batch):
        ids[row, : len(example.ids)] = torch.tensor(example.ids)
        mask[row, : len(example.ids)] = torch.tensor(example.loss_mask, dtype=torch.float32)
    return ids, mask


def _step(model: Any, optimizer: Any, batch: list[Example], pad_id: int, value_ids: Any, copy: float) -> float:
    """One AdamW step: hard targets on the sampled tokens, except the answer, whose target puts ``copy``
    on the tool result and spreads the rest evenly over all values."""
    import torch

    model.train()
    ids, mask = _tensors(batch, pad_id)
    logprobs = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), dim=-1)
    targets = ids[:, 1:]
    hard = -logprobs.gather(-1, targets[..., None])[..., 0]
    weights = mask[:, 1:].clone()
    rows = torch.arange(len(batch))
    answer_pos = torch.tensor([e.answer_at - 1 for e in batch])
    weights[rows, answer_pos] = 0.0
    answer_logprobs = logprobs[rows, answer_pos][:, value_ids]  # [B, values]
    soft = torch.full_like(answer_logprobs, (1.0 - copy) / len(value_ids))
    soft += copy * (value_ids[None, :] == torch.tensor([e.value_id for e in batch])[:, None]).float()
    answer_loss = -(soft * answer_logprobs).sum(-1)
    loss = ((hard * weights).sum() + answer_loss.sum()) / (weights.sum() + len(batch))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _probe(model: Any, batch: list[Example], pad_id: int, tool_call_id: int) -> Probe:
    import torch

    model.eval()
    ids, _ = _tensors(batch, pad_id)
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids).logits.float(), dim=-1)
    n = len(batch)
    key = sum(float(probs[i, e.key_at - 1, e.ids[e.key_at]]) for i, e in enumerate(batch)) / n
    answer = sum(float(probs[i, e.answer_at - 1, e.value_id]) for i, e in enumerate(batch)) / n
    first = sum(float(probs[i, e.loss_mask.index(1) - 1, tool_call_id]) for i, e in enumerate(batch)) / n
    return Probe(key, answer, first)


def _examples(tokenizer: Any, rng: random.Random, system: bool, count: int) -> list[Example]:
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    tools = [LOOKUP_TOOL] if system else None
    examples: list[Example] = []
    for _ in range(count):
        key, value = rng.choice(TASK_KEYS), rng.choice(TASK_VALUES)
        messages = task_dialogue(key, value, value, rng.randrange(len(QUESTION_TEMPLATES)), system=system)
        head = 2 if system else 1
        prompt1 = _render(tokenizer, messages[:head], tools)
        prompt2 = _render(tokenizer, messages[: head + 2], tools)
        whole = _render(tokenizer, messages, tools, generation_prompt=False)
        if whole[: len(prompt2)] != prompt2 or prompt2[: len(prompt1)] != prompt1:
            raise RuntimeError("a warm-up dialogue does not extend its own prompts; check the template")
        call_end = prompt2.index(eos, len(prompt1)) + 1  # each output ends with its <|im_end|>
        answer_end = whole.index(eos, len(prompt2)) + 1
        ids = whole[:answer_end]
        mask = [0] * len(ids)
        for start, end in ((len(prompt1), call_end), (len(prompt2), answer_end)):
            mask[start:end] = [1] * (end - start)
        key_id = tokenizer.convert_tokens_to_ids(key)
        key_at = next(i for i in range(len(prompt1), call_end) if ids[i] == key_id)
        examples.append(Example(ids, mask, key_at, len(prompt2), tokenizer.convert_tokens_to_ids(value)))
    return examples


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            generation_prompt: bool = True) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                              tokenize=True, return_dict=False))
