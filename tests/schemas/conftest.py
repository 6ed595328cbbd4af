from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from schemas.codec import get_codec
from schemas.examples import example_record
from schemas.prompt_delta import full_prompt
from schemas.tokens import pack_floats, pack_ids

VOCAB = 151_936


@pytest.fixture
def call_record_factory() -> Callable[..., dict[str, Any]]:
    def make(prompt_len: int, output_len: int, seed: int = 0) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        record = example_record(get_codec().store.schema("CallRecord").raw)
        record["prompt"] = full_prompt(rng.integers(0, VOCAB, prompt_len, dtype=np.uint32))
        record["output_ids"] = pack_ids(rng.integers(0, VOCAB, output_len, dtype=np.uint32))
        record["output_logprobs"] = pack_floats(-rng.random(output_len, dtype=np.float32) * 5)
        return record

    return make
