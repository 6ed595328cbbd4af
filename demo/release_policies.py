"""The policy versions ``tokentrail demo --release`` releases, trained here in a few seconds.

Online RL on the demo model needs minutes before versions differ by much (``tokentrail demo``), so the
release demo trains its versions offline, on the lookup task's own reward, before serving them:

* serving (v1): the reference model as its build trained it (the supervised format warm-up);
* good candidate (v2): v1 trained further on the task reward;
* bad candidate (v3): v1 trained on the *flipped* reward (1 - correct): really worse, not a label.

Each step is an exact policy-gradient step on the answer turn of the task's dialogues: the expected
reward ``sum_v p(v) r(v)`` over the answer token (here ``r`` is 1 for the tool result's value and 0
otherwise, flipped: the other way round), computed in closed form over the vocabulary instead of from
sampled rollouts. The tool-call turn keeps the warm-up's supervised target, so every version still calls
the tool (AdamW moves every weight, and the answer term alone soon breaks the call format). Deterministic:
seeded dialogues, one thread. ``answer_probe`` is the mean probability
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
from models.reference.template import EOS_TOKEN


@dataclass(frozen=True)
class AnswerExample:
    ids: list[int]  # the dialogue up to and including the answer's generation prompt
    call: tuple[int, int]  # [start, end) of the tool-call turn (the first sampled output) in ``ids``
    value_id: int  # the tool result: the right answer


@dataclass(frozen=True)
class ReleaseVersions:
    serving: int
    good: int
    bad: int
    probes: dict[int, float]  # version -> mean probability of the right answer (held-out dialogues)


def answer_examples(tokenizer: Any, seed: int, count: int) -> list[AnswerExample]:
    rng = random.Random(seed)
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    examples = []
    for _ in range(count):
        key, value = rng.choice(TASK_KEYS), rng.choice(TASK_VALUES)
        messages = task_dialogue(key, value, value, rng.randrange(len(QUESTION_TEMPLATES)))
        first = _render(tokenizer, messages[:2])
        ids = _render(tokenizer, messages[:4])
        if ids[: len(first)] != first:
            raise RuntimeError("a task dialogue does not extend its first prompt; check the template")
        examples.append(AnswerExample(ids, (len(first), ids.index(eos, len(first)) + 1),
                                      tokenizer.convert_tokens_to_ids(value)))
    return examples


def _render(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=[LOOKUP_TOOL], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


def _forward(model: Any, batch: list[AnswerExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(p(answer = the right value), mean log-likelihood of the tool-call turn) for each example."""
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, example in enumerate(batch):  # right-padded: positions are the natural ones
        ids[row, : len(example.ids)] = torch.tensor(example.ids)
        attention[row, : len(example.ids)] = 1
    logprobs = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits.float(), dim=-1)
    rows = torch.arange(len(batch))
    last = torch.tensor([len(e.ids) - 1 for e in batch])
    answer = logprobs[rows, last, torch.tensor([e.value_id for e in batch])].exp()
    call = torch.stack([logprobs[row, e.call[0] - 1: e.call[1] - 1].gather(
        -1, torch.tensor(e.ids[e.call[0]: e.call[1]])[:, None]).mean() for row, e in enumerate(batch)])
    return answer, call


def answer_probe(model: Any, examples: list[AnswerExample], pad_id: int) -> float:
    model.eval()
    with torch.no_grad():
        return float(_forward(model, examples, pad_id)[0].mean())


def train_on_reward(model: Any, examples: list[AnswerExample], pad_id: int, steps: int, flipped: bool,
                    lr: float, batch: int, seed: int) -> None:
    """``steps`` AdamW steps ascending the expected task reward of the answer (descending it when ``flipped``),
    while the tool-call turn keeps its supervised target (the format every version keeps)."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        chosen = [examples[rng.randrange(len(examples))] for _ in range(batch)]
        answer, call = _forward(model, chosen, pad_id)
        expected_reward = (1.0 - answer if flipped else answer).mean()
        optimizer.zero_grad(set_to_none=True)
        (-expected_reward - call.mean()).backward()
        optimizer.step()
    model.eval()


def prepare_versions(model_dir: Path, store: PolicyStore, progress: Callable[[str], None], *,
                     good_steps: int = 20, bad_steps: int = 20, lr: float = 1e-3, seed: int = 0) -> ReleaseVersions:
    """Publish v1 (serving: the reference weights), v2 (good candidate) and v3 (bad candidate) into ``store``;
    the same weights for a given model and arguments (the store refuses a version with other weights)."""
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
        serving_state = {k: v.clone() for k, v in model.state_dict().items()}
        probes = {1: answer_probe(model, held_out, pad_id)}
        store.publish(1, serving_state, {"release_demo": "serving: the reference model (its build's warm-up)"})
        train_on_reward(model, train, pad_id, good_steps, flipped=False, lr=lr, batch=16, seed=seed + 2)
        probes[2] = answer_probe(model, held_out, pad_id)
        store.publish(2, model.state_dict(), {"release_demo": "good candidate: v1 + task reward",
                                              "steps": good_steps})
        model.load_state_dict(serving_state)
        train_on_reward(model, train, pad_id, bad_steps, flipped=True, lr=lr, batch=16, seed=seed + 3)
        probes[3] = answer_probe(model, held_out, pad_id)
        store.publish(3, model.state_dict(), {"release_demo": "bad candidate: v1 + flipped task reward",
                                              "steps": bad_steps})
    finally:
        torch.set_num_threads(threads)
    for version, what in ((1, "serving"), (2, "good candidate"), (3, "bad candidate")):
        progress(f"  v{version} ({what}): p(right answer | tool result) on held-out dialogues {probes[version]:.2f}")
    return ReleaseVersions(serving=1, good=2, bad=3, probes=probes)
