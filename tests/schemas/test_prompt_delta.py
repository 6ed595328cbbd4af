"""Delta-encoded prompts: exact reconstruction, and loud failures when the base or hash disagrees."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.codec import get_codec
from schemas.examples import example_record
from schemas.prompt_delta import (
    MIN_SHARED_PREFIX,
    DeltaBaseMissing,
    DeltaHashMismatch,
    common_prefix_len,
    encode_prompt,
    is_delta,
    reconstruct_prompt,
)
from schemas.tokens import IDS_DTYPE


def _attempt(turns: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(prompt, output) per call of a multi-turn attempt whose context grows by output + tool result."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 151_936, 2_000, dtype=np.uint32)
    calls = []
    for _ in range(turns):
        output = rng.integers(0, 151_936, 300, dtype=np.uint32)
        calls.append((prompt, output))
        prompt = np.concatenate([prompt, output, rng.integers(0, 151_936, 200, dtype=np.uint32)])
    return calls


def test_delta_chain_reconstructs_exactly_through_avro() -> None:
    codec = get_codec()
    calls = _attempt(16)
    sequences: dict[str, np.ndarray] = {}
    encoded = []
    for i, (prompt, output) in enumerate(calls):
        base_id = f"call-{i - 1}" if i else None
        base_seq = sequences.get(base_id) if base_id else None
        record = example_record(codec.store.schema("CallRecord").raw)
        record["prompt"] = encode_prompt(prompt, base_id, base_seq)
        record["call_id"] = f"call-{i}"
        assert is_delta(record["prompt"]) == (i > 0)
        encoded.append(codec.encode("CallRecord", record))
        sequences[f"call-{i}"] = np.concatenate([prompt, output])
    rebuilt: dict[str, np.ndarray] = {}
    for i, data in enumerate(encoded):
        _, record = codec.decode(data)
        prompt = reconstruct_prompt(record["prompt"], lambda cid: rebuilt.get(cid))
        np.testing.assert_array_equal(prompt, calls[i][0])
        rebuilt[record["call_id"]] = np.concatenate([prompt, calls[i][1]])


def test_missing_base_and_wrong_hash_raise() -> None:
    (p0, o0), (p1, _) = _attempt(2)
    delta = encode_prompt(p1, "base", np.concatenate([p0, o0]))
    with pytest.raises(DeltaBaseMissing):
        reconstruct_prompt(delta, lambda _cid: None)
    tampered_base = np.concatenate([p0, o0]).copy()
    tampered_base[5] += 1
    with pytest.raises(DeltaHashMismatch):
        reconstruct_prompt(delta, lambda _cid: tampered_base)
    with pytest.raises(DeltaHashMismatch):
        reconstruct_prompt(delta, lambda _cid: tampered_base[:10])
    wrong_hash = dict(delta, sha256="0" * 64)
    with pytest.raises(DeltaHashMismatch):
        reconstruct_prompt(wrong_hash, lambda _cid: np.concatenate([p0, o0]))


def test_short_shared_prefix_stores_the_full_prompt() -> None:
    prompt = np.arange(100, dtype=IDS_DTYPE)
    base = np.concatenate([prompt[: MIN_SHARED_PREFIX - 1], [99_999]]).astype(IDS_DTYPE)
    assert not is_delta(encode_prompt(prompt, "base", base))


@given(st.lists(st.integers(0, 50), max_size=60), st.lists(st.integers(0, 50), max_size=60))
def test_common_prefix_len_matches_definition(a: list[int], b: list[int]) -> None:
    expected = 0
    while expected < min(len(a), len(b)) and a[expected] == b[expected]:
        expected += 1
    assert common_prefix_len(np.array(a, dtype=IDS_DTYPE), np.array(b, dtype=IDS_DTYPE)) == expected


@given(st.lists(st.integers(0, 2**32 - 1), min_size=20, max_size=80), st.integers(0, 80),
       st.lists(st.integers(0, 2**32 - 1), max_size=40))
def test_any_delta_round_trips(base: list[int], cut: int, tail: list[int]) -> None:
    base_arr = np.array(base, dtype=IDS_DTYPE)
    prompt = np.concatenate([base_arr[:cut], np.array(tail, dtype=IDS_DTYPE)])
    encoded = encode_prompt(prompt, "b", base_arr)
    np.testing.assert_array_equal(reconstruct_prompt(encoded, lambda _cid: base_arr), prompt)
