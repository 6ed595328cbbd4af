"""Reading call records back from Kafka and recomputing what they must contain."""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.prompt_delta import reconstruct_prompt
from schemas.tokens import IdArray, unpack_floats, unpack_ids
from testkit.kafka_read import first_records
from tokentrail.settings import Settings


def read_calls(settings: Settings, topic: str, rollout_id: str, count: int,
               timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The first ``count`` CallRecords of ``rollout_id`` on ``topic``, in call order."""
    found = [record for _, record in first_records(
        settings.kafka, topic, count, timeout_s=timeout_s,
        where=lambda name, r: name == "CallRecord" and r["rollout_id"] == rollout_id)]
    assert len(found) == count, f"expected {count} call records of {rollout_id} on {topic}, found {len(found)}"
    return sorted(found, key=lambda r: r["call_index"])


def full_prompts(calls: list[dict[str, Any]]) -> list[IdArray]:
    """Each call's prompt ids, rebuilding delta-encoded prompts from their base call's prompt ‖ output."""
    by_id = {c["call_id"]: c for c in calls}
    done: dict[str, IdArray] = {}

    def prompt(call: dict[str, Any]) -> IdArray:
        if call["call_id"] not in done:
            done[call["call_id"]] = reconstruct_prompt(call["prompt"], sequence)
        return done[call["call_id"]]

    def sequence(call_id: str) -> IdArray | None:
        base = by_id.get(call_id)
        return None if base is None else np.concatenate([prompt(base), unpack_ids(base["output_ids"])])

    return [prompt(c) for c in calls]


def output_of(call: dict[str, Any]) -> tuple[list[int], np.ndarray]:
    return unpack_ids(call["output_ids"]).tolist(), unpack_floats(call["output_logprobs"])


def reference_logprobs(model: Any, call: dict[str, Any], prompt_ids: IdArray) -> np.ndarray:
    """Logprobs of the recorded output ids from one transformers forward pass over prompt ‖ output:
    RAW = log_softmax of the logits; PROCESSED = of the call's temperature/top-k/top-p distribution."""
    import torch

    from producers.upstreams.embedded.sampling import RowParams, processed_logits

    output_ids, _ = output_of(call)
    ids = torch.tensor([[*prompt_ids.tolist(), *output_ids]], dtype=torch.long)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()
    logits = logits[len(prompt_ids) - 1: len(prompt_ids) - 1 + len(output_ids)]
    if call["logprob_kind"] == "PROCESSED":
        s = call["sampling"]
        logits = processed_logits(logits, [RowParams(s["temperature"], s["top_k"], s["top_p"])] * len(logits))
    chosen = torch.tensor(output_ids, dtype=torch.long)[:, None]
    return torch.log_softmax(logits, dim=-1).gather(-1, chosen)[:, 0].numpy()
