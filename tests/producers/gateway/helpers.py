"""Reading the gateway's records back from Kafka and checking them against the model."""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.prompt_delta import reconstruct_prompt
from schemas.tokens import IdArray, unpack_floats, unpack_ids
from testkit.kafka_read import first_records
from tokentrail.settings import Settings


def read_records(settings: Settings, topic: str, count: int, *, timeout_s: float = 60.0,
                 where: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The first ``count`` records of ``topic`` (matching ``where``), as (schema name, record)."""
    found = first_records(settings.kafka, topic, count, timeout_s=timeout_s,
                          where=lambda _, r: not where or all(r.get(k) == v for k, v in where.items()))
    assert len(found) == count, f"expected {count} records on {topic}, found {len(found)}"
    return found


def prompts_of(calls: list[dict[str, Any]]) -> list[IdArray]:
    """Full prompt ids of each call, rebuilding delta-encoded prompts from their base calls."""
    by_id = {c["call_id"]: c for c in calls}
    done: dict[str, IdArray] = {}

    def sequence(call_id: str) -> IdArray | None:
        base = by_id.get(call_id)
        if base is None:
            return None
        return np.concatenate([prompt(base), unpack_ids(base["output_ids"])])

    def prompt(call: dict[str, Any]) -> IdArray:
        if call["call_id"] not in done:
            done[call["call_id"]] = reconstruct_prompt(call["prompt"], sequence)
        return done[call["call_id"]]

    return [prompt(c) for c in calls]


def is_token_prefix(earlier: IdArray, later: IdArray) -> bool:
    return len(earlier) <= len(later) and bool(np.array_equal(earlier, later[: len(earlier)]))


def output_of(call: dict[str, Any]) -> tuple[IdArray, np.ndarray]:
    return unpack_ids(call["output_ids"]), unpack_floats(call["output_logprobs"])


def engine_logprobs(model: Any, call: dict[str, Any], prompt_ids: IdArray) -> np.ndarray:
    """The logprobs the engine should have recorded for this call's sampled ids, recomputed with one
    forward pass over prompt ‖ output and the call's own sampling parameters."""
    import torch

    from producers.upstreams.embedded.sampling import RowParams, processed_logits

    output_ids, _ = output_of(call)
    ids = torch.tensor(np.concatenate([prompt_ids, output_ids]).astype(np.int64))[None]
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()
    start = len(prompt_ids) - 1
    logits = logits[start:start + len(output_ids)]
    if call["logprob_kind"] == "PROCESSED":
        s = call["sampling"]
        logits = processed_logits(logits, [RowParams(s["temperature"], s["top_k"], s["top_p"])] * len(logits))
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs.gather(-1, torch.tensor(output_ids.astype(np.int64))[:, None])[:, 0].numpy()
