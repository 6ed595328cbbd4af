"""Building the Avro event dicts the gateway emits (CallRecord, AttemptStarted, EnvStep, AttemptFinished).

Pure functions: inputs in, plain dicts out, matching schemas/*.avsc.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from schemas.ids import event_id
from schemas.prompt_delta import PromptTokens, full_prompt
from schemas.tokens import NO_IDS, IdArray, pack_floats, pack_ids

if TYPE_CHECKING:
    from producers.delivery.quarantine import QuarantinedRecord

REDACTED = "[redacted]"
# Header and body field names whose values are credentials (compared lower-case, '-' and '_' alike).
_SECRET_NAMES = {"authorization", "x_api_key", "api_key", "apikey", "proxy_authorization", "cookie",
                 "set_cookie", "x_goog_api_key", "access_token", "secret", "password"}
# Headers worth keeping with a request: protocol versions, betas, harness sessions, identity.
_KEPT_HEADER_PREFIXES = ("anthropic-", "openai-", "x-", "user-agent", "content-type", "authorization")


def _is_secret(name: str) -> bool:
    return name.lower().replace("-", "_") in _SECRET_NAMES


def redact(value: Any) -> Any:
    """Deep copy with every credential-named field replaced."""
    if isinstance(value, dict):
        return {k: (REDACTED if _is_secret(str(k)) and v not in (None, "") else redact(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def request_json(method: str, path: str, query: str, headers: dict[str, str], body: Any) -> str:
    """The harness request as sent (headers that matter, body as parsed), credentials redacted."""
    kept = {k.lower(): v for k, v in headers.items() if k.lower().startswith(_KEPT_HEADER_PREFIXES)}
    doc = {"method": method, "path": path, "query": query, "headers": redact(kept), "body": redact(body)}
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS).decode()


def canonical_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True)
class Versions:
    model: str
    policy_version: int
    tokenizer_fingerprint: str
    chat_template_fingerprint: str
    adapter_version: str
    parser_version: str
    engine: str
    upstream: str

    def as_record(self) -> dict[str, Any]:
        return {"model": self.model, "policy_version": int(self.policy_version),
                "tokenizer_fingerprint": self.tokenizer_fingerprint,
                "chat_template_fingerprint": self.chat_template_fingerprint,
                "adapter_version": self.adapter_version, "parser_version": self.parser_version,
                "engine": self.engine, "upstream": self.upstream}


def sampling_record(*, temperature: float, top_p: float, top_k: int, max_tokens: int, seed: int | None,
                    stop: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    return {"temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k),
            "max_tokens": int(max_tokens), "seed": seed, "stop": list(stop),
            "extra_json": canonical_json(extra)}


def call_record(*, call_id: str, rollout_id: str, attempt_id: str, call_index: int, session_id: str | None,
                protocol: str, streamed: bool, error: dict[str, Any] | None, prompt: PromptTokens,
                output_ids: list[int] | IdArray, output_logprobs: list[float], logprob_kind: str, finish_reason: str,
                versions: Versions, sampling: dict[str, Any], prefix_mode: str, spliced_outputs: int,
                prefix_breaks: list[str], received_at_us: int, queue_ms: float, first_token_ms: float,
                total_ms: float, request: str, response: str) -> dict[str, Any]:
    return {
        "event_id": call_id, "call_id": call_id, "rollout_id": rollout_id, "attempt_id": attempt_id,
        "call_index": call_index, "session_id": session_id, "protocol": protocol, "streamed": streamed,
        "status": "ERROR" if error else "OK", "error": error, "prompt": prompt,
        "output_ids": pack_ids(output_ids), "output_logprobs": pack_floats(output_logprobs),
        "logprob_kind": logprob_kind, "finish_reason": finish_reason, "versions": versions.as_record(),
        "sampling": sampling, "prefix_mode": prefix_mode, "spliced_outputs": spliced_outputs,
        "prefix_breaks": list(prefix_breaks),
        "timings": {"received_at_us": received_at_us, "queue_ms": float(queue_ms),
                    "first_token_ms": float(first_token_ms), "total_ms": float(total_ms)},
        "request_json": request, "response_json": response,
    }


def attempt_started(*, rollout_id: str, attempt_id: str, attempt_number: int, group_id: str | None,
                    group_key: dict[str, str], expected_group_size: int | None, task_input: Any,
                    metadata: dict[str, Any]) -> dict[str, Any]:
    return {"event_id": event_id("attempt_started", rollout_id, attempt_id), "rollout_id": rollout_id,
            "attempt_id": attempt_id, "group_id": group_id, "group_key": dict(group_key),
            "expected_group_size": expected_group_size, "task_input_json": canonical_json(task_input),
            "metadata_json": canonical_json(metadata), "attempt_number": attempt_number,
            "created_at_us": now_us()}


def env_step(*, event_id_: str, rollout_id: str, attempt_id: str, event_index: int, kind: str,
             call_id: str | None, name: str | None, payload: Any) -> dict[str, Any]:
    return {"event_id": event_id_, "rollout_id": rollout_id, "attempt_id": attempt_id,
            "event_index": event_index, "kind": kind, "call_id": call_id, "name": name,
            "payload_json": canonical_json(payload), "created_at_us": now_us()}


def attempt_finished(*, rollout_id: str, attempt_id: str, status: str, call_count: int, event_count: int,
                     final_artifacts: Any) -> dict[str, Any]:
    return {"event_id": event_id("attempt_finished", rollout_id, attempt_id), "rollout_id": rollout_id,
            "attempt_id": attempt_id, "status": status, "call_count": call_count, "event_count": event_count,
            "final_artifacts_json": canonical_json(final_artifacts), "created_at_us": now_us()}


def quarantined_call(record: dict[str, Any], where: QuarantinedRecord) -> dict[str, Any]:
    """What stands on Kafka for a call record too large for it: the same call (ids, versions, sampling,
    timings), status ERROR, no tokens, and where the whole record is kept with its size and hash."""
    original_error = record.get("error")
    reference = {"quarantined": {"path": str(where.path), "bytes": where.size, "sha256": where.sha256,
                                 "reason": where.reason, "status": record["status"],
                                 "error": original_error}}
    return {
        **record,
        "status": "ERROR",
        "error": {"type": "record_quarantined", "message": where.reason,
                  "status_code": original_error["status_code"] if original_error else 200},
        "prompt": full_prompt(NO_IDS), "output_ids": pack_ids(NO_IDS), "output_logprobs": pack_floats([]),
        "spliced_outputs": 0, "prefix_breaks": [],
        "request_json": canonical_json(reference), "response_json": canonical_json(reference),
    }
