"""Tokenizing ASCII prompts: the fast encoder (producers/ascii_encoder.py) against the tokenizer itself.

Texts: chat prompts of about ``--tokens`` tokens rendered by the reference model's template, every one
different (words, numbers, contractions, punctuation, code-like lines, whitespace runs). Baseline, same
process: ``tokenizers.Tokenizer.encode_batch_fast`` (the fastest call the library has, no offsets). The
fast encoder is timed with its per-part memo warm (parts seen before, as in a running gateway) and cold
(cleared before every text: every word new). Every text's ids are compared with the baseline's.

    python -m bench.tokenize [--texts N] [--tokens T]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence

from bench.common import emit

WORDS = ["result", "found", "line", "file", "error", "value", "returns", "match", "path", "status", "count",
         "test", "passed", "module", "config", "key", "index", "the", "of", "and", "gradient", "window"]


def _text(rng: random.Random, words: int) -> str:
    out: list[str] = []
    for n in range(words):
        roll = rng.random()
        if roll < 0.6:
            out.append(rng.choice(WORDS))
        elif roll < 0.75:  # a word never seen before
            out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))))
        elif roll < 0.85:
            out.append(str(rng.randint(0, 10**rng.randint(1, 6))))
        elif roll < 0.9:
            out.append(rng.choice(["don't", "it's", "we'll", "I'M", "they're"]))
        else:
            out.append(rng.choice(["(x)", "x.y", "==", "->", "{\"k\": 1},", "!?", "--", "/tmp/a_b.py:12"]))
        if n % 17 == 16:
            out.append(rng.choice(["\n", "\n\n", "\n    ", "\t"]))
    return " ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=60, help="prompts to tokenize")
    parser.add_argument("--tokens", type=int, default=4096, help="about this many tokens a prompt")
    args = parser.parse_args()

    from models.reference.build import build_model
    from producers.ascii_encoder import AsciiEncoder
    from producers.rendering import ChatRenderer
    from tokentrail.settings import get_settings

    renderer = ChatRenderer(build_model(get_settings().model.dir))
    tokenizer = renderer.tokenizer.backend_tokenizer
    encoder = AsciiEncoder.for_tokenizer(tokenizer)
    if encoder is None:
        raise SystemExit("the reference tokenizer got no fast encoder")
    rng = random.Random(0)
    words = max(1, args.tokens * 2 // 9)  # about 4.5 tokens a word here, with the template around it
    texts = [renderer.render_text([{"role": "system", "content": "You are terse."},
                                   {"role": "user", "content": _text(rng, words)}]) for _ in range(args.texts)]
    print(f"{len(texts)} prompts of {sum(map(len, texts)) // len(texts)} characters ...", flush=True)

    def timed(encode: Callable[[str], Sequence[int] | None]) -> tuple[float, list[list[int]]]:
        ids: list[list[int]] = []
        began = time.thread_time()
        for text in texts:
            ids.append(list(encode(text) or ()))  # None (not vouched for) would show as a mismatch
        return time.thread_time() - began, ids

    def baseline(text: str) -> list[int]:
        return tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def cold(text: str) -> list[int] | None:
        encoder._memo.clear()
        return encoder.encode(text)

    timed(baseline)  # warm both up once
    hf_s, expected = timed(baseline)
    cold_s, cold_ids = timed(cold)
    timed(encoder.encode)
    fast_s, fast_ids = timed(encoder.encode)
    mismatches = sum(a != b for a, b in zip(expected, fast_ids, strict=True)) + \
        sum(a != b for a, b in zip(expected, cold_ids, strict=True))
    tokens = sum(map(len, expected))
    emit({
        "texts": len(texts),
        "tokens_per_text": tokens // len(texts),
        "tokenizer_us_per_text": hf_s / len(texts) * 1e6,
        "fast_us_per_text": fast_s / len(texts) * 1e6,
        "fast_cold_memo_us_per_text": cold_s / len(texts) * 1e6,
        "tokenizer_ns_per_token": hf_s / tokens * 1e9,
        "fast_ns_per_token": fast_s / tokens * 1e9,
        "speedup": hf_s / fast_s,
        "speedup_cold_memo": hf_s / cold_s,
        "mismatched_texts": mismatches,
    })
    if mismatches:
        raise SystemExit(f"{mismatches} texts got other ids than the tokenizer's")


if __name__ == "__main__":
    main()
