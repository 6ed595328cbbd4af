"""Sampled splits: a scripted output as a sampler could have emitted it, not as the tokenizer would encode it.

A model samples one token at a time, so the ids of its output are often not the tokenizer's encoding of the
same text (" tests" sampled as " te" + "sts"). Scripted outputs tokenized by the tokenizer never show that, so a
plain re-render of the history looks as good as the splice. Here some words of each output are split into two
tokens that decode to the same text: the output parses the same, the splice keeps the sampled ids, and the
judges' drift figure counts the tokens a re-render would have changed.

Only whole ASCII words of at least four letters are split, every ``every``-th one, and for harmony only inside
message bodies (headers and channel names are the format's, not the model's prose).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_WORD = re.compile(r"^ ?[A-Za-z]{4,}$")
_HARMONY_BODY_START = "<|message|>"
_HARMONY_BODY_ENDS = ("<|end|>", "<|call|>", "<|return|>")


def sampled_split(ids: Sequence[int], encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], *,
                  every: int = 3, harmony: bool = False) -> list[int]:
    """``ids`` with every ``every``-th splittable word token replaced by two tokens of the same text."""
    out: list[int] = []
    seen = 0
    in_body = not harmony
    for token in ids:
        piece = decode([int(token)])
        if harmony and piece == _HARMONY_BODY_START:
            in_body = True
        elif harmony and piece in _HARMONY_BODY_ENDS:
            in_body = False
        if in_body and _WORD.match(piece):
            seen += 1
            if seen % every == 0:
                cut = len(piece) // 2
                parts = encode(piece[:cut]) + encode(piece[cut:])
                if decode(parts) == piece and parts != [token]:
                    out += parts
                    continue
        out.append(int(token))
    return out
