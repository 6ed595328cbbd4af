"""Prompts stored as verified deltas on an earlier call of the same attempt.

A later call's prompt usually starts with an earlier call's prompt ‖ output. Instead of storing the
whole prompt again, the record names that base call, how many of its (prompt ‖ output) tokens are
shared, the new tokens after them, and the sha256 of the whole prompt. Reconstruction is exact and
checked against the hash, so storage grows with the rollout, not with its square.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from schemas.ids import ids_digest
from schemas.tokens import IDS_DTYPE, IdArray, pack_ids, unpack_ids

PromptTokens = dict[str, Any]  # an Avro PromptTokens record

# A delta only pays off when the shared prefix is a real part of the prompt.
MIN_SHARED_PREFIX = 16


class PromptReconstructionError(ValueError):
    """A delta-encoded prompt cannot be rebuilt exactly."""


class DeltaBaseMissing(PromptReconstructionError):
    pass


class DeltaHashMismatch(PromptReconstructionError):
    pass


def common_prefix_len(a: IdArray, b: IdArray) -> int:
    """Length of the longest common prefix of two id arrays (vectorised)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def full_prompt(ids: IdArray | list[int]) -> PromptTokens:
    packed = pack_ids(ids)
    return {"length": len(packed) // 4, "sha256": ids_digest(packed), "ids": packed,
            "base_call_id": None, "base_prefix_len": 0, "new_ids": None}


def encode_prompt(ids: IdArray | list[int], base_call_id: str | None = None,
                  base_sequence: IdArray | None = None) -> PromptTokens:
    """Encode a prompt, as a delta on ``base_sequence`` (base prompt ‖ base output) when that pays off."""
    arr = np.asarray(ids, dtype=IDS_DTYPE)
    if base_call_id is None or base_sequence is None:
        return full_prompt(arr)
    shared = common_prefix_len(arr, np.asarray(base_sequence, dtype=IDS_DTYPE))
    if shared < MIN_SHARED_PREFIX:
        return full_prompt(arr)
    packed_all = arr.tobytes()
    return {"length": len(arr), "sha256": ids_digest(packed_all), "ids": None,
            "base_call_id": base_call_id, "base_prefix_len": shared, "new_ids": arr[shared:].tobytes()}


def is_delta(prompt: PromptTokens) -> bool:
    return prompt.get("ids") is None


BaseLookup = Callable[[str], "IdArray | tuple[IdArray, IdArray] | None"]


def reconstruct_prompt(prompt: PromptTokens, base_sequence: BaseLookup) -> IdArray:
    """Rebuild the full prompt ids, verified by length and sha256.

    ``base_sequence(call_id)`` returns that call's prompt ‖ output ids, either joined or as the pair
    (prompt, output) — the pair avoids materialising the join just to copy its prefix. Raises
    DeltaBaseMissing when the base is unknown and DeltaHashMismatch when the result is wrong.
    """
    if prompt.get("ids") is not None:
        ids = unpack_ids(prompt["ids"])
    else:
        base_id = prompt.get("base_call_id")
        if not base_id:
            raise PromptReconstructionError("prompt has neither ids nor a delta base")
        base = base_sequence(base_id)
        if base is None:
            raise DeltaBaseMissing(f"delta base call {base_id} is not available")
        parts = base if isinstance(base, tuple) else (base,)
        available = sum(len(part) for part in parts)
        shared = int(prompt["base_prefix_len"])
        if shared > available:
            raise DeltaHashMismatch(f"delta shares {shared} tokens but base call {base_id} has only {available}")
        new = unpack_ids(prompt.get("new_ids") or b"")
        ids = np.empty(shared + len(new), dtype=IDS_DTYPE)
        filled = 0
        for part in parts:
            take = min(len(part), shared - filled)
            ids[filled:filled + take] = part[:take]
            filled += take
        ids[shared:] = new
    if len(ids) != prompt["length"]:
        raise DeltaHashMismatch(f"prompt has {len(ids)} tokens, record says {prompt['length']}")
    if ids_digest(ids.tobytes()) != prompt["sha256"]:
        raise DeltaHashMismatch("prompt ids do not match the recorded sha256")
    return ids
