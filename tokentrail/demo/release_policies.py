"""The policy versions ``tokentrail demo --release`` releases, trained here in a few seconds.

Online RL on the demo model needs minutes before versions differ by much (``tokentrail demo``), so the
release demo trains its versions offline, on the lookup task's own reward, before serving them:

* serving (v1): the reference model (its build's supervised warm-up) plus a few steps on the task reward;
* good candidate (v2): v1 trained further on the task reward;
* bad candidate (v3): v1 trained on the *flipped* reward (1 - correct): really worse, not a label.

Each step is an exact policy-gradient step on the answer turn of the task's dialogues: the expected
reward ``sum_v p(v) r(v)`` over the answer token (here ``r`` is 1 for the tool result's value and 0
otherwise, flipped: the other way round), computed in closed form over the vocabulary instead of from
sampled rollouts. Deterministic: seeded dialogues, one thread. ``answer_probe`` is the mean probability
of the right answer on held-out dialogues, printed beside each version.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.policy_store import PolicyStore
from models.reference.task import LOOKUP_TOOL, QUESTION_TEMPLATES, TASK_KEYS, TASK_VALUES, task_dialogue


@dataclass(frozen=True)
class AnswerExample:
    ids: list[int]  # the dialogue up to and including the answer's generation prompt
    value_id: int  # the tool result: the right answer


@dataclass(frozen=True)
class ReleaseVersions:
    serving: int
    good: int
    bad: int
    probes: dict[int, float]  # version -> mean probability of the right answer (held-out dialogues)


def answer_examples(tokenizer: Any, seed: int, count: int) -> list[AnswerExample]:
    rng = random.Random(seed)
    examples = []
    for _ in range(count):
        key, value = rng.choice(TASK_KEYS), rng.choice(TASK_VALUES)
        messages = task_dialogue(key, value, value, rng.randrange(len(QUESTION_TEMPLATES)))[:-1]
        ids = list(tokenizer.apply_chat_template(messages, tools=[LOOKUP_TOOL], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False))
        examples.append(AnswerExample(ids, tokenizer.convert_tokens_to_ids(value)))
    return examples


def _answer_probs(model: Any, batch: list[AnswerExample], pad_id: int) -> torch.Tensor:
    """p(answer token = the right value) for each example (left-padded so the last position is the answer)."""
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, example in enumerate(batch):
        ids[row, width - len(example.ids):] = torch.tensor(example.ids)
        attention[row, width - len(example.ids):] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits[:, -1].float()
    probs = torch.softmax(logits, dim=-1)
    return probs[torch.arange(len(batch)), torch.tensor([e.value_id for e in batch])]


def answer_probe(model: Any, examples: list[AnswerExample], pad_id: int) -> float:
    model.eval()
    with torch.no_grad():
        return float(_answer_probs(model, examples, pad_id).mean())


def train_on_reward(model: Any, examples: list[AnswerExample], pad_id: int, steps: int, flipped: bool,
                    lr: float, batch: int, seed: int) -> None:
    """``steps`` AdamW steps ascending the expected task reward (descending it when ``flipped``)."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        chosen = [examples[rng.randrange(len(examples))] for _ in range(batch)]
        expected_reward = _answer_probs(model, chosen, pad_id).mean()
        if flipped:
            expected_reward = 1.0 - expected_reward
        optimizer.zero_grad(set_to_none=True)
        (-expected_reward).backward()
        optimizer.step()
    model.eval()


def prepare_versions(model_dir: Path, store: PolicyStore, progress: Callable[[str], None], *,
                     serving_steps: int = 3, good_steps: int = 12, bad_steps: int = 10, lr: float = 3e-3,
                     seed: int = 0) -> ReleaseVersions:
    """Publish v1 (serving), v2 (good candidate) and v3 (bad candidate) into ``store``; idempotent for a
    given model and arguments (the store refuses a version with other weights)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same reductions on every run
    torch.manual_seed(seed)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        train = answer_examples(tokenizer, seed, 256)
        held_out = answer_examples(tokenizer, seed + 1, 64)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        probes = {0: answer_probe(model, held_out, pad_id)}
        train_on_reward(model, train, pad_id, serving_steps, flipped=False, lr=lr, batch=16, seed=seed + 2)
        serving_state = {k: v.clone() for k, v in model.state_dict().items()}
        probes[1] = answer_probe(model, held_out, pad_id)
        store.publish(1, serving_state, {"release_demo": "serving: reference + task reward",
                                          "steps": serving_steps})
        train_on_reward(model, train, pad_id, good_steps, flipped=False, lr=lr, batch=16, seed=seed + 3)
        probes[2] = answer_probe(model, held_out, pad_id)
        store.publish(2, model.state_dict(), {"release_demo": "good candidate: v1 + task reward",
                                              "steps": good_steps})
        model.load_state_dict(serving_state)
        train_on_reward(model, train, pad_id, bad_steps, flipped=True, lr=lr, batch=16, seed=seed + 4)
        probes[3] = answer_probe(model, held_out, pad_id)
        store.publish(3, model.state_dict(), {"release_demo": "bad candidate: v1 + flipped task reward",
                                              "steps": bad_steps})
    finally:
        torch.set_num_threads(threads)
    for version, what in ((0, "reference"), (1, "serving"), (2, "good candidate"), (3, "bad candidate")):
        progress(f"  v{version} ({what}): p(right answer) on held-out dialogues {probes[version]:.2f}")
    return ReleaseVersions(serving=1, good=2, bad=3, probes=probes)
