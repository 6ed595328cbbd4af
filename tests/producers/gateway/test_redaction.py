"""What the gateway stores has no credentials in it (issue 17): query strings, credential-style headers and
body fields named like credentials are "[redacted]" in a call's stored request, and environment payloads
(task input, metadata, event payloads, final artifacts) get the same rule; request fields that only look
alike (``max_tokens``, ``token_ids``, ``top_logprobs``, thinking ``signature``s) are kept as sent."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from producers.gateway import records
from producers.gateway.records import REDACTED, is_secret_field, redact, request_json
from producers.sdk import Rollout
from tokentrail.settings import Settings

from .helpers import read_records

MODEL = "tokentrail-tiny"
USER = [{"role": "user", "content": "hi"}]
SECRET = "sk-live-7d1e0c"  # every credential below; it must never be stored

CREDENTIAL_FIELDS = [
    "token", "client_secret", "private_key", "clientSecret", "privateKey", "accessToken", "access_token",
    "refresh_token", "id_token", "auth_token", "x-auth-token", "password", "db_password", "passwd",
    "aws_secret_access_key", "secret", "secrets", "session_key", "sessionKey", "api_key", "apiKey", "apikey",
    "x_api_key", "credential", "credentials", "authorization", "Authorization", "cookie", "set-cookie",
    "github_token", "bearer_token", "passphrase", "signing_key", "auth",
]
# Real request fields (OpenAI, Anthropic, vLLM extras) and environment names that must stay as sent.
ORDINARY_FIELDS = [
    "max_tokens", "max_completion_tokens", "max_output_tokens", "logprobs", "top_logprobs", "token_ids",
    "prompt_token_ids", "stop_token_ids", "budget_tokens", "skip_special_tokens", "input_tokens",
    "output_tokens", "cache_creation_input_tokens", "tokens", "tokenizer", "signature", "prompt_cache_key",
    "idempotency_key", "key", "group_key", "session_id", "user_id", "author", "bos_token", "eos_token",
    "pad_token", "max_token", "monkey", "keyword", "tokenize", "n", "seed", "user", "pwd",
]


@pytest.mark.parametrize("name", CREDENTIAL_FIELDS)
def test_credential_named_fields_are_secret(name: str) -> None:
    assert is_secret_field(name)


@pytest.mark.parametrize("name", ORDINARY_FIELDS)
def test_ordinary_fields_are_not_secret(name: str) -> None:
    assert not is_secret_field(name)


def test_query_string_credentials_are_redacted() -> None:
    query = f"beta=true&api_key={SECRET}&key={SECRET}&token={SECRET}&access_token={SECRET}&x=1&sig={SECRET}"
    doc = orjson.loads(request_json("POST", "/v1/messages", query, {}, {"model": "m"}))
    assert doc["query"] == f"beta=true&api_key={REDACTED}&key={REDACTED}&token={REDACTED}" \
                           f"&access_token={REDACTED}&x=1&sig={REDACTED}"
    # Encoded names and odd shapes: a name is matched decoded; a parameter without a value stays.
    doc = orjson.loads(request_json("POST", "/v1/messages", f"API%5FKEY={SECRET}&flag&Token={SECRET}", {}, {}))
    assert doc["query"] == f"API%5FKEY={REDACTED}&flag&Token={REDACTED}"
    assert orjson.loads(request_json("POST", "/v1/m", "beta=true", {}, {}))["query"] == "beta=true"


def test_credential_style_headers_are_redacted() -> None:
    headers = {
        "Authorization": f"Bearer {SECRET}", "x-api-key": SECRET, "X-Auth-Token": SECRET, "x-goog-api-key": SECRET,
        "x-session-token": SECRET, "x-amz-security-token": SECRET, "x-client-secret": SECRET, "x-password": SECRET,
        "x-csrf-token": SECRET, "x-upstream-key": SECRET, "x-refresh-token": SECRET,
        # kept as sent: protocol versions, betas, SDK telemetry, sessions and rollout identity
        "anthropic-version": "2023-06-01", "anthropic-beta": "token-efficient-tools-2025-02-19",
        "x-stainless-lang": "python", "x-stainless-retry-count": "0", "x-claude-code-session-id": "s-1",
        "x-rollout-id": "r-1", "user-agent": "Anthropic/Python 0.40", "host": "h",
    }
    doc = orjson.loads(request_json("POST", "/v1/messages", "", headers, {}))
    secret_names = [k.lower() for k, v in headers.items() if v == SECRET or SECRET in v]
    assert {k: doc["headers"][k] for k in secret_names} == dict.fromkeys(secret_names, REDACTED)
    assert doc["headers"]["anthropic-beta"] == "token-efficient-tools-2025-02-19"
    assert doc["headers"]["x-stainless-retry-count"] == "0" and doc["headers"]["x-claude-code-session-id"] == "s-1"
    assert "host" not in doc["headers"]
    assert SECRET not in orjson.dumps(doc).decode()


def test_body_fields_are_redacted_by_pattern_and_request_fields_kept() -> None:
    body: dict[str, Any] = {
        "model": "m", "max_tokens": 5, "max_completion_tokens": 6, "max_output_tokens": 7, "logprobs": True,
        "top_logprobs": 3, "stop_token_ids": [1, 2], "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "sig"}]}],
        "metadata": {"user_id": "u", "client_secret": SECRET, "nested": [{"private_key": SECRET}]},
        "token": SECRET, "clientSecret": SECRET, "credentials": {"user": "a", "pass": SECRET},
        "empty_token": "", "null_password": None,
    }
    doc = orjson.loads(request_json("POST", "/v1/chat/completions", "", {}, body))["body"]
    assert SECRET not in orjson.dumps(doc).decode()
    for kept in ("max_tokens", "max_completion_tokens", "max_output_tokens", "logprobs", "top_logprobs",
                 "stop_token_ids", "thinking", "messages", "model"):
        assert doc[kept] == body[kept], kept
    assert doc["metadata"] == {"user_id": "u", "client_secret": REDACTED, "nested": [{"private_key": REDACTED}]}
    assert doc["token"] == doc["clientSecret"] == doc["credentials"] == REDACTED
    assert doc["empty_token"] == "" and doc["null_password"] is None  # nothing to hide: kept as sent


def test_redaction_of_deep_values_stops_where_nothing_can_be_stored() -> None:
    deep: Any = {"password": SECRET}
    for _ in range(2000):  # deeper than Python's recursion limit; orjson refuses to write it anyway
        deep = {"a": deep}
    redact(deep)  # no RecursionError
    with pytest.raises(TypeError):
        records.canonical_json(redact(deep))


def test_environment_payloads_are_redacted() -> None:
    payload = {"stdout": "ok", "env": {"GITHUB_TOKEN": SECRET, "HOME": "/root"}, "max_tokens": 3}
    step = records.env_step(event_id_="e", rollout_id="r", attempt_id="a", event_index=0, kind="STEP",
                            call_id=None, name="shell", payload=payload)
    assert orjson.loads(step["payload_json"]) == {"stdout": "ok", "env": {"GITHUB_TOKEN": REDACTED, "HOME": "/root"},
                                                  "max_tokens": 3}
    started = records.attempt_started(rollout_id="r", attempt_id="a", attempt_number=1, group_id=None, group_key={},
                                      expected_group_size=None, task_input={"question": "q", "api_key": SECRET},
                                      metadata={"owner": "me", "password": SECRET})
    assert orjson.loads(started["task_input_json"]) == {"question": "q", "api_key": REDACTED}
    assert orjson.loads(started["metadata_json"]) == {"owner": "me", "password": REDACTED}
    finished = records.attempt_finished(rollout_id="r", attempt_id="a", status="SUCCESS", call_count=0, event_count=0,
                                        final_artifacts={"answer": "4", "deploy": {"private_key": SECRET}})
    assert orjson.loads(finished["final_artifacts_json"]) == {"answer": "4", "deploy": {"private_key": REDACTED}}
    # A payload that is a bare list or scalar is stored as it is.
    assert orjson.loads(records.env_step(event_id_="e", rollout_id="r", attempt_id="a", event_index=1, kind="STEP",
                                         call_id=None, name=None, payload=[1, "token"])["payload_json"]) == [1, "token"]


def test_stored_calls_and_environment_records_carry_no_credentials(
        start_gateway, topics: dict[str, str], tokentrail_settings: Settings) -> None:
    """End to end through Kafka: a call with credentials in its query, headers and body, and an attempt whose
    task input, events and artifacts name credentials; then a good plain call, which is stored as sent."""
    with start_gateway() as gw, Rollout(gw.url, task_input={"question": "2+2", "db_password": SECRET},
                                        metadata={"client_secret": SECRET}) as rollout:
        url = f"{rollout.openai_base_url}/chat/completions?api_key={SECRET}&beta=true"
        leaky = httpx.post(url, json={"model": MODEL, "messages": USER, "max_tokens": 2, "token": SECRET},
                           headers={"authorization": f"Bearer {rollout.api_key}", "x-auth-token": SECRET})
        assert leaky.status_code == 200, leaky.text
        good = httpx.post(f"{rollout.openai_base_url}/chat/completions",
                          json={"model": MODEL, "messages": USER, "max_tokens": 2, "top_logprobs": 2, "logprobs": True})
        assert good.status_code == 200, good.text
        rollout.event("TOOL_RESULT", {"output": "done", "session_key": SECRET})
        rollout.finish("SUCCESS", {"answer": "4", "credentials": {"token": SECRET}})
    calls = [r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 2)]
    env = [r for _, r in read_records(tokentrail_settings, topics["env_topic"], 3)]
    for record in calls + env:
        assert SECRET not in repr(record)
    first, second = sorted(calls, key=lambda r: r["call_index"])
    stored = orjson.loads(first["request_json"])
    assert stored["query"] == f"api_key={REDACTED}&beta=true"
    assert stored["headers"]["x-auth-token"] == REDACTED and stored["body"]["token"] == REDACTED
    assert stored["body"]["max_tokens"] == 2
    assert orjson.loads(second["request_json"])["body"] == {"model": MODEL, "messages": USER, "max_tokens": 2,
                                                           "top_logprobs": 2, "logprobs": True}
    started, step, finished = sorted(env, key=lambda r: ("task_input_json" not in r, "status" in r))
    assert orjson.loads(started["task_input_json"]) == {"question": "2+2", "db_password": REDACTED}
    assert orjson.loads(started["metadata_json"]) == {"client_secret": REDACTED}
    assert orjson.loads(step["payload_json"]) == {"output": "done", "session_key": REDACTED}
    assert orjson.loads(finished["final_artifacts_json"]) == {"answer": "4", "credentials": REDACTED}
