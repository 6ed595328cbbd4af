"""Bytes a weight sync moves per update on real training steps: whole changed tensors (the group delta) against
only the changed elements in the engine's dtype (the element delta), and the projection to a 7B/8B bf16 model.

The trainer's own learner (``trainer_consumer.learner.Learner``: its policy-gradient loss, AdamW, gradient
clipping) takes ``--steps`` consecutive steps on the reference model over the reference task's dialogues
(``models.reference.warmup``'s tool-call dialogues, the outputs scored with on-policy logprobs and a random
advantage per sequence). After every step the weights are published into a policy store with ``delta=True``
for each engine dtype, exactly as the trainer publishes (``PolicyStore.publish``), and the files are read back:

    full       the whole checkpoint in the engine's dtype (what a full sync moves)
    tensor     the group delta's bytes over the full checkpoint (``delta.json``'s ``delta_bytes``): "before"
    element    the element delta file's bytes (indices / bitmask / dense per tensor, values, its safetensors
               header) over the full checkpoint: "after"
    changed    the elements whose value changed in that dtype, over all elements

Every element delta is also applied to what an engine holds (the previous version, cast to its dtype) and must
reconstruct the published version bit for bit (``apply_element_delta``'s checksums), or the bench fails.

The reference engines serve float32 (the embedded engine, and deploy/vllm/serve.sh ``--dtype float32``); an
8B model is served in bf16. The projection multiplies the measured bf16 element-delta fraction by 8e9 x 2 bytes;
the fraction depends on the weights' magnitudes against the step (bf16 keeps 8 bits of mantissa), and a
0.9M-parameter model's are not an 8B model's, so it is a rough guide (peers publish about 1% on an 8B model).

    python -m bench.delta_fraction [--steps 5] [--lrs 2e-4,1e-6] [--dtypes bfloat16,float32] [--samples 16]

Last line: one JSON object: per learning rate and dtype, the mean fractions and bytes per update and the
7B/8B projections; ``bf16_element_fraction`` and ``bf16_tensor_fraction`` at the first learning rate. Also the
trainer's cost of the deltas: each publish timed with them (``publish_s`` per dtype) and without them
(``publish_without_delta_s``: the same weights into a store of their own, as with ``trainer.publish_delta`` off).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import emit
from models.element_delta import Mirror, apply_element_delta, cast_state
from models.policy_delta import load_element_delta, read_delta, read_element_delta
from models.policy_store import PolicyStore

PARAMS = {"7b": 7.0e9, "8b": 8.0e9}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def task_samples(tokenizer: Any, count: int, seed: int) -> list[tuple[list[int], int]]:
    """(token ids, where the first sampled output starts) of ``count`` reference-task dialogues."""
    from models.reference.warmup import _examples

    examples = _examples(tokenizer, random.Random(seed), system=True, count=count)
    return [(e.ids, e.loss_mask.index(1)) for e in examples]


def on_policy_samples(learner: Any, dialogues: list[tuple[list[int], int]], rng: np.random.Generator) -> list[Any]:
    """The dialogues as training samples whose rollout logprobs are the model's own (an on-policy step)."""
    from testkit.samples import SequenceSpec, sample_record
    from trainer_consumer.sample_view import sample_from_record

    def build(logprobs: list[np.ndarray] | None) -> list[Any]:
        out = []
        for i, (ids, start) in enumerate(dialogues):
            prompt, output = np.asarray(ids[:start], np.uint32), np.asarray(ids[start:], np.uint32)
            lp = logprobs[i] if logprobs is not None else np.full(len(output), -1.0, np.float32)
            spec = SequenceSpec(f"r{i}", prompt, output, lp, float(rng.normal()), group_id=f"g{i // 8}")
            out.append(sample_from_record(sample_record([spec])))
        return out

    draft = build(None)
    flat = learner.sample_logprobs(draft).float().numpy()
    logprobs, offset = [], 0
    for (ids, start), sample in zip(dialogues, draft, strict=True):
        logprobs.append(flat[offset + start: offset + len(ids)].astype(np.float32))
        offset += sample.num_tokens
    return build(logprobs)


def measure(model_dir: str, tokenizer: Any, lr: float, steps: int, samples: int, dtypes: list[str],
            seed: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from trainer_consumer.learner import Learner, LearnerConfig

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    learner = Learner(model, LearnerConfig(learning_rate=lr, micro_batch_tokens=None))
    rng = np.random.default_rng(seed)
    rows: dict[str, list[dict[str, float]]] = {d: [] for d in dtypes}
    plain_publish_s: list[float] = []  # the trainer's publish without deltas (trainer.publish_delta off)
    with tempfile.TemporaryDirectory(prefix="delta-fraction-") as tmp:
        stores = {d: PolicyStore(Path(tmp) / d) for d in dtypes}
        plain = PolicyStore(Path(tmp) / "plain")
        plain.publish(1, model.state_dict())
        held = {d: Mirror.of(cast_state(model.state_dict(), DTYPES[d])) for d in dtypes}
        for d in dtypes:
            stores[d].publish(1, model.state_dict(), delta=True, engine_dtype=DTYPES[d])
        for step in range(steps):
            batch = on_policy_samples(learner, task_samples(tokenizer, samples, seed * 1000 + step), rng)
            result = learner.step(batch)
            version = step + 2
            began = time.perf_counter()
            plain.publish(version, model.state_dict())
            plain_publish_s.append(time.perf_counter() - began)
            for d in dtypes:
                store = stores[d]
                began = time.perf_counter()
                store.publish(version, model.state_dict(), delta=True, engine_dtype=DTYPES[d])
                publish_s = time.perf_counter() - began
                group, element = read_delta(store.path(version)), read_element_delta(store.path(version))
                assert group is not None and element is not None
                began = time.perf_counter()
                held[d], _ = apply_element_delta(held[d], load_element_delta(store.path(version)))
                apply_s = time.perf_counter() - began
                assert held[d].digest == Mirror.of(cast_state(model.state_dict(), DTYPES[d])).digest
                row = {"tensor_fraction": group.delta_bytes / group.full_bytes,
                       "element_fraction": element.nbytes / element.full_bytes,
                       "changed_fraction": element.changed_elements / element.total_elements,
                       "element_bytes": element.nbytes, "full_bytes": element.full_bytes,
                       "tensor_bytes": group.delta_bytes * element.full_bytes / group.full_bytes,
                       "apply_s": apply_s, "publish_s": publish_s, "encodings": element.encodings}
                rows[d].append(row)
                print(f"  lr {lr:g} step {step + 1} ({d}, loss {result.stats.loss:.3f}): changed "
                      f"{row['changed_fraction']:.2%} of elements; moves tensor {row['tensor_fraction']:.1%} / "
                      f"element {row['element_fraction']:.2%} of {element.full_bytes:,} B "
                      f"({element.nbytes:,} B; {element.encodings}); publish {publish_s * 1e3:.0f} ms with the "
                      f"deltas, {plain_publish_s[-1] * 1e3:.0f} ms without", flush=True)
    figures: dict[str, Any] = {"lr": lr, "steps": steps,
                               "publish_without_delta_s": statistics.fmean(plain_publish_s)}
    for d, items in rows.items():
        mean = {k: statistics.fmean(float(r[k]) for r in items) for k in
                ("tensor_fraction", "element_fraction", "changed_fraction", "element_bytes", "tensor_bytes",
                 "full_bytes", "apply_s", "publish_s")}
        figures[d] = {**mean, "element_fraction_max": max(float(r["element_fraction"]) for r in items),
                      "per_step_element_fraction": [float(r["element_fraction"]) for r in items]}
    if "bfloat16" in rows:
        bf16 = figures["bfloat16"]
        for name, n in PARAMS.items():
            figures[f"projected_{name}_bf16_full_gb"] = n * 2 / 1e9
            figures[f"projected_{name}_bf16_tensor_delta_gb"] = n * 2 * bf16["tensor_fraction"] / 1e9
            figures[f"projected_{name}_bf16_element_delta_gb"] = n * 2 * bf16["element_fraction"] / 1e9
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.delta_fraction", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lrs", default="2e-4,1e-6",
                        help="learning rates, comma-separated (2e-4: the trainer's default; 1e-6: a typical "
                             "large-model RL rate)")
    parser.add_argument("--steps", type=int, default=5, help="consecutive training steps per learning rate")
    parser.add_argument("--samples", type=int, default=16, help="dialogues per step")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="engine dtypes, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from models.reference.build import build_model
    from tokentrail.settings import get_settings

    torch.set_num_threads(1)  # a shared 2-core machine
    model_dir = str(build_model(get_settings().model.dir))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = set(dtypes) - set(DTYPES)
    if unknown:
        parser.error(f"unknown dtypes {sorted(unknown)}; choose from {sorted(DTYPES)}")
    figures: dict[str, Any] = {}
    for lr in (float(x) for x in args.lrs.split(",")):
        figures[f"lr_{lr:g}"] = measure(model_dir, tokenizer, lr, args.steps, args.samples, dtypes, args.seed)
    first = next(iter(figures.values()))
    if "bfloat16" in first:
        figures["bf16_element_fraction"] = first["bfloat16"]["element_fraction"]
        figures["bf16_tensor_fraction"] = first["bfloat16"]["tensor_fraction"]
    emit(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
