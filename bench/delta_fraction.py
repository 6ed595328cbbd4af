"""How much of a bf16 checkpoint one optimizer step changes, and what a delta sync would move for a 7B/8B model.

One real AdamW step (the trainer's optimizer) on the reference model, next-token loss over random token ids,
at the trainer's learning rate and at a typical large-model RL one. Before and after are cast to bf16 (what an
engine serving bf16 holds), and ``models.policy_delta.plan_delta`` says what changed: ``changed_bytes`` (the
elements whose bf16 value moved: what an element-sparse delta moves) and ``delta_bytes`` (whole weight groups
with any change: what this repo's delta load moves through vLLM's reload path). The element fraction is then
projected to 7B and 8B parameters in bf16 (2 bytes each); it depends on the weights' magnitudes against the
step size, so the projection from a tiny model is a rough guide, not a measurement of an 8B model.

    python -m bench.delta_fraction [--lrs 2e-4,1e-6] [--seed 0]

Last line: one JSON object, per learning rate: element and group fractions and the 7B/8B projections.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from bench.common import emit
from models.policy_delta import plan_delta

PARAMS = {"7b": 7.0e9, "8b": 8.0e9}


def one_step_fraction(model_dir: str, lr: float, seed: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    before = {k: v.detach().to(torch.bfloat16).clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    ids = torch.randint(0, model.config.vocab_size, (4, 64))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    after = {k: v.detach().to(torch.bfloat16).clone() for k, v in model.state_dict().items()}
    plan = plan_delta(before, after)
    assert plan is not None
    element = plan.changed_bytes / plan.full_bytes
    return {"lr": lr, "full_bytes": plan.full_bytes, "changed_bytes": plan.changed_bytes,
            "element_fraction": element, "group_fraction": plan.delta_bytes / plan.full_bytes,
            "groups_changed": len(plan.groups),
            **{f"projected_{name}_bf16_full_gb": n * 2 / 1e9 for name, n in PARAMS.items()},
            **{f"projected_{name}_bf16_delta_gb": n * 2 * element / 1e9 for name, n in PARAMS.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.delta_fraction", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lrs", default="2e-4,1e-6", help="learning rates, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from models.reference.build import build_model
    from tokentrail.settings import get_settings

    model_dir = str(build_model(get_settings().model.dir))
    figures: dict[str, Any] = {}
    for lr in (float(x) for x in args.lrs.split(",")):
        row = one_step_fraction(model_dir, lr, args.seed)
        print(f"  lr {lr:g}: {row['changed_bytes']} of {row['full_bytes']} bf16 bytes changed "
              f"({row['element_fraction']:.2%}); groups {row['group_fraction']:.0%}; 8B bf16: "
              f"{row['projected_8b_bf16_delta_gb']:.2f} of {row['projected_8b_bf16_full_gb']:.0f} GB", flush=True)
        figures[f"lr_{lr:g}"] = row
    emit(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
