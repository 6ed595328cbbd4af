"""Token-level prefix relation between adjacent calls of an attempt (vectorised, no per-token loop).

``prompt_i ‖ output_i`` is a prefix of ``prompt_{i+1}`` only when every id matches; a text-level
prefix is not enough (chat templates insert control tokens at message boundaries, re-tokenizing
history changes segmentation, templates drop earlier reasoning).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from schemas.tokens import IdArray

PrefixLink = dict[str, Any]  # an Avro PrefixLink record


def common_prefix_len_concat(head: IdArray, tail: IdArray, other: IdArray) -> int:
    """Longest common prefix of ``head ‖ tail`` and ``other``, without building ``head ‖ tail``."""
    n_head = min(len(head), len(other))
    if n_head:
        diff = np.flatnonzero(head[:n_head] != other[:n_head])
        if diff.size:
            return int(diff[0])
    if n_head < len(head):  # other ended inside head
        return n_head
    rest = other[len(head):]
    n_tail = min(len(tail), len(rest))
    if n_tail == 0:
        return len(head)
    diff = np.flatnonzero(tail[:n_tail] != rest[:n_tail])
    return len(head) + (int(diff[0]) if diff.size else n_tail)


def prefix_link(from_index: int, to_index: int, prompt: IdArray, output: IdArray,
                next_prompt: IdArray) -> PrefixLink:
    expected = len(prompt) + len(output)
    shared = common_prefix_len_concat(prompt, output, next_prompt)
    return {"from_call_index": from_index, "to_call_index": to_index, "is_prefix": shared == expected,
            "common_prefix_len": shared, "expected_len": expected}


def prefix_links(call_indices: Sequence[int], prompts: Sequence[IdArray],
                 outputs: Sequence[IdArray]) -> list[PrefixLink]:
    """One link per adjacent pair of calls, in call-index order."""
    return [prefix_link(call_indices[i], call_indices[i + 1], prompts[i], outputs[i], prompts[i + 1])
            for i in range(len(call_indices) - 1)]
