"""Codec benchmark: a call record with a 32k-token prompt and 1k-token output, Avro vs JSON.

Baseline, same process: the same record as JSON with token lists (stdlib json), which is what a
naive implementation stores. Also: stored bytes for a 16-call attempt whose context grows to 32k,
delta-encoded prompts against full prompts.
"""

from __future__ import annotations

import json

import numpy as np

from bench.common import best_time, emit
from schemas.codec import get_codec
from schemas.examples import example_record
from schemas.prompt_delta import encode_prompt, full_prompt
from schemas.tokens import pack_floats, pack_ids, unpack_floats, unpack_ids

VOCAB = 151_936
PROMPT, OUTPUT = 32_768, 1_024


def main() -> None:
    rng = np.random.default_rng(0)
    codec = get_codec()
    prompt = rng.integers(0, VOCAB, PROMPT, dtype=np.uint32)
    output = rng.integers(0, VOCAB, OUTPUT, dtype=np.uint32)
    logprobs = (-rng.random(OUTPUT) * 8).astype(np.float32)
    base = example_record(codec.store.schema("CallRecord").raw)

    def avro_round_trip() -> int:
        record = dict(base, prompt=full_prompt(prompt), output_ids=pack_ids(output),
                      output_logprobs=pack_floats(logprobs))
        data = codec.encode("CallRecord", record)
        _, back = codec.decode(data)
        ids = unpack_ids(back["prompt"]["ids"])
        lps = unpack_floats(back["output_logprobs"])
        return len(data) + int(ids[-1]) + int(lps.size)

    json_base = {k: v for k, v in base.items() if not isinstance(v, bytes | dict)}

    def json_round_trip() -> int:
        record = dict(json_base, prompt_ids=prompt.tolist(), output_ids=output.tolist(),
                      output_logprobs=logprobs.tolist())
        data = json.dumps(record).encode()
        back = json.loads(data)
        ids = np.asarray(back["prompt_ids"], dtype=np.uint32)
        return len(data) + int(ids[-1])

    avro_s = best_time(avro_round_trip, repeat=7, number=20)
    json_s = best_time(json_round_trip, repeat=3, number=3)
    avro_bytes = len(codec.encode("CallRecord", dict(base, prompt=full_prompt(prompt), output_ids=pack_ids(output),
                                                     output_logprobs=pack_floats(logprobs))))
    json_bytes = len(json.dumps(dict(json_base, prompt_ids=prompt.tolist(), output_ids=output.tolist(),
                                     output_logprobs=logprobs.tolist())).encode())
    token_payload = (PROMPT + OUTPUT) * 4 + OUTPUT * 4

    # 16-call attempt, context growing to 32k: each call's prompt = previous prompt ‖ output ‖ tool result.
    calls = 16
    step = (PROMPT - 2_048) // (calls - 1)
    ctx = rng.integers(0, VOCAB, 2_048, dtype=np.uint32)
    full_total = delta_total = tokens_total = 0
    previous: tuple[str, np.ndarray] | None = None
    for i in range(calls):
        out = rng.integers(0, VOCAB, 256, dtype=np.uint32)
        lp = pack_floats(np.zeros(len(out)))
        rec_full = dict(base, prompt=full_prompt(ctx), output_ids=pack_ids(out), output_logprobs=lp)
        rec_delta = dict(rec_full, prompt=encode_prompt(ctx, *(previous or (None, None))))
        full_total += len(codec.encode("CallRecord", rec_full))
        delta_total += len(codec.encode("CallRecord", rec_delta))
        tokens_total += len(ctx) + len(out)
        previous = (f"call-{i}", np.concatenate([ctx, out]))
        ctx = np.concatenate([ctx, out, rng.integers(0, VOCAB, max(step - len(out), 1), dtype=np.uint32)])

    print(f"call record, {PROMPT} prompt + {OUTPUT} output tokens, vocab {VOCAB}")
    emit({
        "avro_round_trip_ms": avro_s * 1e3,
        "json_round_trip_ms": json_s * 1e3,
        "speedup_vs_json": json_s / avro_s,
        "avro_bytes": avro_bytes,
        "json_bytes": json_bytes,
        "size_vs_json": avro_bytes / json_bytes,
        "token_mb_per_s": token_payload / avro_s / 1e6,
        "attempt_full_bytes_per_token": full_total / tokens_total,
        "attempt_delta_bytes_per_token": delta_total / tokens_total,
        "delta_vs_full_bytes": delta_total / full_total,
    })


if __name__ == "__main__":
    main()
