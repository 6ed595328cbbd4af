"""Building the Avro event dicts the gateway emits (CallRecord, AttemptStarted, EnvStep, AttemptFinished).

Pure functions: inputs in, plain dicts out, matching schemas/*.avsc.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_plus

import orjson

from schemas.ids import event_id
from schemas.prompt_delta import PromptTokens, full_prompt
from schemas.tokens import NO_IDS, IdArray, pack_floats, pack_ids
from schemas.version_spans import PolicySpan, call_spans

if TYPE_CHECKING:
    from producers.delivery.quarantine import QuarantinedRecord
    from producers.upstreams.base import ReleaseAssignment

REDACTED = "[redacted]"

# What counts as a credential, by name (docs/operations.md, "Security"). Body fields and environment payloads
# go by the words of a name (split at '-', '_', '.', spaces and camelCase), so that request fields that only
# look alike keep their values: ``max_tokens``, ``token_ids``, ``top_logprobs``, ``signature`` (thinking).
# A field is a credential when its name, with the separators taken out, contains one of these:
_SECRET_FRAGMENTS = ("secret", "password", "passwd", "passphrase", "credential", "authorization", "cookie",
                     "apikey", "privatekey", "sessionkey", "accesskey", "signingkey", "encryptionkey",
                     "masterkey", "adminkey", "sshkey")
# ... or one of its words is one of these ...
_SECRET_WORDS = frozenset({"auth", "oauth", "authn", "authentication", "bearer", "jwt"})
# ... or its last word ends in "token" (token, access_token, refreshToken, GITHUB_TOKEN, authtoken), unless
# the token is one of a model's own kinds (bos_token, stop_token, max_token: vocabulary, not credentials).
_TOKEN_KINDS = frozenset({"bos", "eos", "pad", "unk", "sep", "cls", "mask", "stop", "start", "end", "eot", "eom",
                          "special", "max", "min", "num", "first", "last", "next", "prev", "image", "audio", "video",
                          "vision", "tool", "think", "thinking", "reasoning"})
# Headers and query parameters are matched more broadly, on a lower-case substring of the whole name: a
# header or parameter named like any of these is a credential (x-auth-token, x-goog-api-key, ?key=, ?sig=).
# No kept header is exempt: the SDK telemetry (x-stainless-*), protocol (anthropic-*, openai-*) and session
# headers do not match, and a harmless header that did would only lose its value in the stored copy.
_SECRET_NAME_PARTS = ("auth", "token", "key", "secret", "password", "passwd", "cookie", "credential",
                      "signature")
_QUERY_SECRET_NAMES = frozenset({"sig"})
# Headers worth keeping with a request: protocol versions, betas, harness sessions, identity.
_KEPT_HEADER_PREFIXES = ("anthropic-", "openai-", "x-", "user-agent", "content-type", "authorization")
# Values nested deeper than this are left as they are: orjson writes at most 255 levels, so a value this
# deep is never stored (the record that holds it cannot be built), and redaction never runs out of stack.
_MAX_DEPTH = 300
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(name)]


def is_secret_field(name: str) -> bool:
    """Whether a body field or payload key of this name holds a credential (see the rule above)."""
    # Every request repeats the same few names (role, content, ...): remember short ones, so redacting a
    # long conversation costs a lookup per field instead of a regex and a scan of the fragments.
    return _secret_field_known(name) if len(name) <= _MEMO_NAME_CHARS else _secret_field(name)


_MEMO_NAME_CHARS = 64  # with at most _MEMO_NAMES names, the memo holds well under a megabyte
_MEMO_NAMES = 4096


def _secret_field(name: str) -> bool:
    words = _words(name)
    if not words:
        return False
    flat = "".join(words)
    if any(fragment in flat for fragment in _SECRET_FRAGMENTS) or not _SECRET_WORDS.isdisjoint(words):
        return True
    last = words[-1]
    if not last.endswith("token"):
        return False
    kind = last[:-len("token")] or (words[-2] if len(words) > 1 else "")
    return kind not in _TOKEN_KINDS


_secret_field_known = functools.lru_cache(maxsize=_MEMO_NAMES)(_secret_field)


def is_secret_header(name: str) -> bool:
    """Whether a header (or query parameter) of this name holds a credential."""
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_NAME_PARTS)


def redact(value: Any, _depth: int = 0) -> Any:
    """Deep copy with the value of every credential-named field (``is_secret_field``) replaced."""
    if _depth > _MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: (REDACTED if v not in (None, "") and is_secret_field(str(k))
                    else redact(v, _depth + 1) if isinstance(v, dict | list) else v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, _depth + 1) if isinstance(v, dict | list) else v for v in value]
    return value


def redact_query(query: str) -> str:
    """The query string as sent, with the value of every credential-named parameter replaced; the other
    parameters are kept byte for byte."""
    if not query:
        return query
    parts = []
    for part in query.split("&"):
        name, eq, value = part.partition("=")
        plain = unquote_plus(name)
        if eq and value and (is_secret_header(plain) or plain.lower() in _QUERY_SECRET_NAMES):
            part = f"{name}={REDACTED}"
        parts.append(part)
    return "&".join(parts)


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if v and is_secret_header(k) else v) for k, v in headers.items()}


def request_json(method: str, path: str, query: str, headers: dict[str, str], body: Any) -> str:
    """The harness request as sent (headers that matter, body as parsed), credentials redacted.

    The body keeps the harness's key order: chat templates render tool schemas with ``tojson``, which
    keeps it too, so the recorded request re-renders to exactly the prompt the gateway recorded."""
    kept = {k.lower(): v for k, v in sorted(headers.items()) if k.lower().startswith(_KEPT_HEADER_PREFIXES)}
    doc = {"method": method, "path": path, "query": redact_query(query), "headers": redact_headers(kept),
           "body": redact(body)}
    return orjson.dumps(doc).decode()


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
        """The record's ``versions`` (``CallVersions``): these fields as declared above, the version a plain int."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "policy_version": int(self.policy_version)}


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
                total_ms: float, request: str, response: str, scripted: bool = False,
                version_spans: Sequence[PolicySpan] = (), release: ReleaseAssignment | None = None,
                subject: str | None = None) -> dict[str, Any]:
    """``version_spans`` are kept only where they say more than ``versions.policy_version`` (a weight update
    landed mid-call); ``release`` is the release arm that served the call, if a release plan routed it."""
    n_output = len(output_ids)
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
        "request_json": request, "response_json": response, "scripted": scripted,
        "version_spans": call_spans(version_spans, int(versions.policy_version), n_output),
        "release": None if release is None else release.as_record(),
        "subject": subject, "sealed": None,
    }


def attempt_started(*, rollout_id: str, attempt_id: str, attempt_number: int, group_id: str | None,
                    group_key: dict[str, str], expected_group_size: int | None, task_input: Any,
                    metadata: dict[str, Any], subject: str | None = None) -> dict[str, Any]:
    return {"event_id": event_id("attempt_started", rollout_id, attempt_id), "rollout_id": rollout_id,
            "attempt_id": attempt_id, "group_id": group_id, "group_key": dict(group_key),
            "expected_group_size": expected_group_size, "task_input_json": canonical_json(redact(task_input)),
            "metadata_json": canonical_json(redact(metadata)), "attempt_number": attempt_number,
            "created_at_us": now_us(), "subject": subject, "sealed": None}


def env_step(*, event_id_: str, rollout_id: str, attempt_id: str, event_index: int, kind: str,
             call_id: str | None, name: str | None, payload: Any, subject: str | None = None) -> dict[str, Any]:
    return {"event_id": event_id_, "rollout_id": rollout_id, "attempt_id": attempt_id,
            "event_index": event_index, "kind": kind, "call_id": call_id, "name": name,
            "payload_json": canonical_json(redact(payload)), "created_at_us": now_us(), "subject": subject,
            "sealed": None}


def attempt_finished(*, rollout_id: str, attempt_id: str, status: str, call_count: int, event_count: int,
                     final_artifacts: Any, subject: str | None = None) -> dict[str, Any]:
    return {"event_id": event_id("attempt_finished", rollout_id, attempt_id), "rollout_id": rollout_id,
            "attempt_id": attempt_id, "status": status, "call_count": call_count, "event_count": event_count,
            "final_artifacts_json": canonical_json(redact(final_artifacts)), "created_at_us": now_us(),
            "subject": subject, "sealed": None}


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
        "spliced_outputs": 0, "prefix_breaks": [], "version_spans": [],  # no tokens: no spans over them
        "request_json": canonical_json(reference), "response_json": canonical_json(reference),
    }
