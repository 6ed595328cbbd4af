"""Builders of complete input records from token lists: CallRecord, AttemptStarted, EnvStep and
AttemptFinished, every field filled as the gateway fills it. For tests, benchmarks and synthetic data;
the one place outside the gateway that knows a whole record, so a new field is added here once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from schemas.ids import call_id, env_event_id, event_id
from schemas.prompt_delta import encode_prompt, full_prompt
from schemas.tokens import IDS_DTYPE, IdArray, pack_floats, pack_ids

Record = dict[str, Any]

T0_US = 1_700_000_000_000_000


def _ids(values: Sequence[int] | np.ndarray) -> IdArray:
    return np.asarray(values, dtype=IDS_DTYPE)


def chat_response(text: str) -> str:
    return orjson.dumps({"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}).decode()


def make_call(rollout_id: str, attempt_id: str, index: int, prompt: Sequence[int] | np.ndarray,
              output: Sequence[int] | np.ndarray, *, logprobs: Sequence[float] | np.ndarray | None = None,
              base: tuple[str, IdArray] | None = None, prompt_record: Record | None = None,
              policy_version: int = 0, status: str = "OK", text: str = "", received_at_us: int | None = None,
              total_ms: float = 5.0, response_json: str | None = None, request_json: str | None = None,
              versions: Record | None = None, spliced_outputs: int = 0, timings: Record | None = None,
              scripted: bool = False, version_spans: Sequence[tuple[int, int, int]] = (),
              release: Record | None = None, subject: str | None = None) -> Record:
    """A CallRecord; ``base`` = (base call id, base prompt ‖ output) delta-encodes the prompt. ``versions``
    and ``timings`` replace those sub-records whole. ``version_spans``: (version, start, end) over the output."""
    prompt_arr, output_arr = _ids(prompt), _ids(output)
    if logprobs is None:
        logprobs = -((np.arange(len(output_arr), dtype=np.float32) % 7) + 1) / 8
    if prompt_record is None:
        prompt_record = encode_prompt(prompt_arr, base[0], base[1]) if base else full_prompt(prompt_arr)
    cid = call_id(rollout_id, attempt_id, index)
    return {
        "event_id": cid, "call_id": cid, "rollout_id": rollout_id, "attempt_id": attempt_id,
        "call_index": index, "session_id": None, "protocol": "openai.chat", "streamed": False,
        "status": status,
        "error": None if status == "OK" else {"type": "upstream_error", "message": "failed",
                                              "status_code": 500},
        "prompt": prompt_record, "output_ids": pack_ids(output_arr), "output_logprobs": pack_floats(logprobs),
        "logprob_kind": "PROCESSED", "finish_reason": "stop" if status == "OK" else "error",
        "versions": versions if versions is not None else {
            "model": "tiny", "policy_version": policy_version, "tokenizer_fingerprint": "tok-1",
            "chat_template_fingerprint": "tpl-1", "adapter_version": "a1", "parser_version": "p1",
            "engine": "embedded/0.1", "upstream": "embedded"},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 256, "seed": None,
                     "stop": [], "extra_json": "{}"},
        "prefix_mode": "splice", "spliced_outputs": spliced_outputs, "prefix_breaks": [],
        "timings": timings if timings is not None else {
            "received_at_us": received_at_us if received_at_us is not None else T0_US + 1000 * (index + 1),
            "queue_ms": 0.0, "first_token_ms": 1.0, "total_ms": total_ms},
        "request_json": orjson.dumps({"messages": [{"role": "user", "content": "..."}]}).decode()
        if request_json is None else request_json,
        "response_json": chat_response(text) if response_json is None else response_json,
        "scripted": scripted,
        "version_spans": [{"version": v, "start": a, "end": b} for v, a, b in version_spans],
        "release": release,
        "subject": subject, "sealed": None,
    }


def make_started(rollout_id: str, attempt_id: str, *, task_input: Any = None, group_id: str | None = None,
                 group_key: dict[str, str] | None = None, expected_group_size: int | None = None,
                 attempt_number: int = 1, created_at_us: int = T0_US, subject: str | None = None) -> Record:
    return {"event_id": event_id("attempt_started", rollout_id, attempt_id), "rollout_id": rollout_id,
            "attempt_id": attempt_id, "group_id": group_id, "group_key": dict(group_key or {}),
            "expected_group_size": expected_group_size,
            "task_input_json": orjson.dumps(task_input if task_input is not None else {},
                                            option=orjson.OPT_SORT_KEYS).decode(),
            "metadata_json": "{}", "attempt_number": attempt_number, "created_at_us": created_at_us,
            "subject": subject, "sealed": None}


def make_env(rollout_id: str, attempt_id: str, index: int, *, kind: str = "TOOL_RESULT",
             call: str | None = None, payload: Any = None, created_at_us: int | None = None,
             subject: str | None = None) -> Record:
    return {"event_id": env_event_id(rollout_id, attempt_id, kind, index), "rollout_id": rollout_id,
            "attempt_id": attempt_id, "event_index": index, "kind": kind, "call_id": call, "name": "tool",
            "payload_json": orjson.dumps(payload if payload is not None else {"index": index}).decode(),
            "created_at_us": T0_US + 1000 * (index + 1) + 500 if created_at_us is None else created_at_us,
            "subject": subject, "sealed": None}


def make_finished(rollout_id: str, attempt_id: str, call_count: int, event_count: int, *,
                  status: str = "SUCCESS", final_artifacts: Any = None,
                  created_at_us: int | None = None, subject: str | None = None) -> Record:
    return {"event_id": event_id("attempt_finished", rollout_id, attempt_id), "rollout_id": rollout_id,
            "attempt_id": attempt_id, "status": status, "call_count": call_count, "event_count": event_count,
            "final_artifacts_json": orjson.dumps({} if final_artifacts is None else final_artifacts).decode(),
            "created_at_us": T0_US + 1000 * (call_count + 2) if created_at_us is None else created_at_us,
            "subject": subject, "sealed": None}
