"""The embedded engine on a long prompt: the harness model variant (spec ``harness``: 16K vocabulary, 64K
positions) prefills a prompt of ``--tokens`` ids made of harness-like text and samples ``--max-tokens``.
Also reports how many tokens Claude Code's first captured request takes under that tokenizer.

    python -m bench.long_prompt [--tokens 30000] [--max-tokens 16] [--threads 1] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np

from bench.common import emit
from models.reference.build import build_model
from models.reference.harness_corpus import CAPTURED_DIR, harness_texts
from models.reference.spec import HARNESS_SPEC
from producers.gateway.anthropic_adapter import conversation
from producers.gateway.body import validate
from producers.gateway.models_anthropic import MessagesRequest
from producers.gateway.text_side import ModelTextSide
from producers.upstreams.base import GenerateRequest, Sampling
from producers.upstreams.embedded.engine import EmbeddedEngine
from schemas.tokens import IDS_DTYPE
from tokentrail.settings import get_settings


def claude_code_first_request_tokens(text: ModelTextSide) -> tuple[int, int]:
    """(prompt tokens, body characters) of Claude Code's first captured request, rendered by the gateway."""
    first = json.loads((CAPTURED_DIR / "claude.jsonl").read_text().splitlines()[0])
    messages, tools = conversation(validate(MessagesRequest, first["body"]))
    return len(text.renderer.render(messages, tools)), len(json.dumps(first["body"]))


def long_prompt(text: ModelTextSide, tokens: int) -> np.ndarray:
    """``tokens`` ids of harness-like text (the tokenizer's own corpus, repeated if it is shorter)."""
    ids: list[int] = []
    corpus = harness_texts()
    while len(ids) < tokens:
        for piece in corpus:
            ids.extend(text.renderer.encode(piece))
            if len(ids) >= tokens:
                break
    return np.asarray(ids[:tokens], dtype=IDS_DTYPE)


async def timed_calls(engine: EmbeddedEngine, prompt: np.ndarray, max_tokens: int, repeat: int
                      ) -> list[dict[str, float]]:
    out = []
    try:
        await _calls(engine, prompt, max_tokens, repeat, out)
    finally:
        await engine.close()
    return out


async def _calls(engine: EmbeddedEngine, prompt: np.ndarray, max_tokens: int, repeat: int,
                 out: list[dict[str, float]]) -> None:
    for n in range(repeat):
        started = time.perf_counter()
        result = await engine.generate(GenerateRequest(prompt_ids=prompt, request_id=f"long-{n}",
                                                       sampling=Sampling(max_tokens=max_tokens, seed=n)))
        out.append({"wall_s": time.perf_counter() - started, "first_token_ms": result.first_token_ms,
                    "total_ms": result.total_ms, "output_tokens": float(len(result.output_ids))})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=30_000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the gateway's engine uses 1)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="model directory (default: model.harness_dir)")
    args = parser.parse_args(argv)
    model_dir = build_model(args.dir or get_settings().model.harness_dir, spec=HARNESS_SPEC)
    text = ModelTextSide.from_dir(model_dir)
    claude_tokens, claude_chars = claude_code_first_request_tokens(text)
    prompt = long_prompt(text, args.tokens)
    engine = EmbeddedEngine(model_dir, threads=args.threads)
    runs = asyncio.run(timed_calls(engine, prompt, args.max_tokens, args.repeat))
    best = min(runs, key=lambda r: r["wall_s"])
    emit({"bench": "long_prompt", "model_spec": HARNESS_SPEC.digest(), "vocab": text.vocab_size,
          "max_positions": HARNESS_SPEC.max_positions, "prompt_tokens": len(prompt),
          "max_tokens": args.max_tokens, "threads": args.threads, "cpus": os.cpu_count() or 0,
          "load_1m": os.getloadavg()[0], "best_wall_s": best["wall_s"],
          "best_first_token_ms": best["first_token_ms"], "best_total_ms": best["total_ms"],
          "walls_s": [round(r["wall_s"], 2) for r in runs],
          "claude_code_first_request_tokens": claude_tokens, "claude_code_first_request_chars": claude_chars,
          "claude_code_chars_per_token": round(claude_chars / claude_tokens, 2)})


if __name__ == "__main__":
    main()
