"""Needles and records the residue-scan tests plant (tests/schemas, tests/sinks, tests/producers, tests/tokentrail)."""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.codec import get_codec
from schemas.examples import example_record
from schemas.prompt_delta import full_prompt
from schemas.residue import Matcher, Needles, record_decoder
from schemas.tokens import pack_ids

CANARY = "canary-7f3a9c-zebra"
ODD_CANARY = 'Zoë said "hi" <b>&</b> 42'
RUN = (70011, 70012, 70013, 70014, 70015)


def matcher(*canaries: str, runs: tuple[tuple[int, ...], ...] = (RUN,)) -> Matcher:
    return Matcher(Needles(canaries or (CANARY,), runs), record_decoder(get_codec()))


def call_record(prompt: list[int], output: list[int], request_json: str = "{}") -> dict[str, Any]:
    record = example_record(get_codec().store.schema("CallRecord").raw)
    record["prompt"] = full_prompt(np.asarray(prompt, dtype=np.uint32))
    record["output_ids"] = pack_ids(output)
    record["request_json"] = request_json
    for name in ("subject", "sealed"):  # (issue 31's fields, where the contract has them) nobody's, in the clear
        if name in record:
            record[name] = None
    return record


def encode(record: dict[str, Any]) -> bytes:
    return get_codec().encode("CallRecord", record)
