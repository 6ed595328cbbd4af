"""What packing one subject per sample costs (issue 31 item 4; docs/forgetting.md).

``processors/samples.py`` packs a group's pieces per subject, so a forget drops whole samples and never
touches another subject's weights. This measures, with the packing code itself (``_bins``), how many more
samples that makes than packing the group's pieces regardless of subject, and how full the bins are, on a
mix of many users' short organic sessions (each baseline window's group holds a few sessions, mostly of
different users). The trainer's compute does not depend on it: both collate layouts work per sequence
(``padded``: one row per packed sequence; ``packed``: every sequence of the batch in one varlen row).

    python -m bench.subject_packing [--groups 2000] [--seed 0]

The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace

import numpy as np

from processors.samples import PackSpec, Piece, SampleConfig, _bins


def _piece(rng: random.Random, rollout: str, subject: str | None) -> Piece:
    # One call of an agent session: a prompt of the system prompt, tools and the turns so far, a short answer.
    n = rng.randint(300, 3000) + rng.randint(20, 300)
    z = np.zeros(n, dtype=np.float32)
    return Piece("CALL", rollout, "g", np.zeros(n, dtype=np.uint32), np.zeros(n, dtype=np.uint8), z, z, z, [],
                 [0], subject=subject)


def _group(rng: random.Random, users: int) -> list[Piece]:
    """One baseline window's sessions: 3-8 sessions, each of a user drawn from ``users`` (so mostly distinct
    users, sometimes one user twice), each 1-4 calls (split: one piece per call)."""
    pieces = []
    for s in range(rng.randint(3, 8)):
        user = f"user-{rng.randrange(users)}"
        pieces += [_piece(rng, f"r{s}", user) for _ in range(rng.randint(1, 4))]
    return pieces


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=2000)
    p.add_argument("--users", type=int, default=1000, help="active users the sessions are drawn from")
    p.add_argument("--max-tokens", type=int, default=8192, help="pack.max_tokens")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    cfg = SampleConfig(pack=PackSpec(enabled=True, max_tokens=args.max_tokens))
    tokens = per_subject = mixed = pieces_n = 0
    for _ in range(args.groups):
        pieces = _group(rng, args.users)
        pieces_n += len(pieces)
        tokens += sum(len(x.ids) for x in pieces)
        per_subject += len(_bins(pieces, cfg))  # what the sample builder does
        mixed += len(_bins([replace(x, subject=None) for x in pieces], cfg))  # subjects mixed in a sample
    figures = {
        "groups": args.groups, "pieces": pieces_n, "tokens": tokens, "max_tokens": args.max_tokens,
        "samples_per_subject": per_subject, "samples_mixed": mixed,
        "samples_ratio": round(per_subject / mixed, 3),
        "fill_per_subject": round(tokens / (per_subject * args.max_tokens), 3),
        "fill_mixed": round(tokens / (mixed * args.max_tokens), 3),
    }
    print(f"{args.groups} groups, {pieces_n} pieces, {tokens:,} tokens, bins of {args.max_tokens}")
    print(f"  one subject per sample: {per_subject} samples, bins {figures['fill_per_subject']:.1%} full")
    print(f"  subjects mixed:         {mixed} samples, bins {figures['fill_mixed']:.1%} full")
    print(f"  ratio: {figures['samples_ratio']:.2f}x the samples (records on the topic); trainer compute "
          "the same (both collate layouts work per sequence)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
