"""Attempt registry, identity resolution and redaction: the bookkeeping behind call indices."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from producers.gateway.attempt_state import DeliveredCall, SampledOutput
from producers.gateway.attempts import UNATTRIBUTED, AttemptRegistry
from producers.gateway.errors import GatewayError
from producers.gateway.identity import resolve_call
from producers.gateway.records import REDACTED, request_json


def _resolve(
    registry: AttemptRegistry,
    path: dict | None = None,
    headers: dict | None = None,
    unattributed: str = "record",
    require_auth: bool = False,
):
    return resolve_call(
        path or {},
        headers or {},
        registry,
        unattributed=unattributed,
        require_auth=require_auth,
        admin_key="",
    )


def test_identity_by_path_header_and_key_and_finish_errors() -> None:
    registry = AttemptRegistry()
    state = registry.start(None, {})
    by_path = _resolve(registry, path={"rollout_id": state.rollout_id, "attempt_id": state.attempt_id})
    by_header = _resolve(registry, headers={"x-rollout-id": state.rollout_id})
    by_key = _resolve(registry, headers={"authorization": f"Bearer {state.api_key}", "x-claude-code-session-id": "s1"})
    assert by_path.state is by_header.state is by_key.state is state
    assert (by_path.via, by_header.via, by_key.via) == ("path", "header", "api_key")
    assert by_key.session_id == "s1"
    assert [state.begin_call() for _ in range(3)] == [0, 1, 2]

    registry.finish(state.rollout_id, state.attempt_id, "SUCCESS")
    for kwargs in (
        {"path": {"rollout_id": state.rollout_id, "attempt_id": state.attempt_id}},
        {"headers": {"x-api-key": state.api_key}},
    ):
        with pytest.raises(GatewayError) as info:
            _resolve(registry, **kwargs)
        assert info.value.status == 409 and info.value.code == "attempt_finished"
    with pytest.raises(GatewayError) as info:
        registry.finish(state.rollout_id, state.attempt_id, "SUCCESS")
    assert info.value.status == 409
    with pytest.raises(GatewayError) as info:
        _resolve(registry, path={"rollout_id": "nope", "attempt_id": "x"})
    assert info.value.status == 404 and info.value.code == "unknown_rollout"
    with pytest.raises(GatewayError) as info:
        _resolve(registry, headers={"authorization": "Bearer tt-forged"})
    assert info.value.status == 401


def test_unattributed_calls_are_recorded_per_session_or_refused() -> None:
    registry = AttemptRegistry(max_sessions=1)
    a = _resolve(registry, headers={"x-session-id": "one"})
    assert a.rollout_id == UNATTRIBUTED and a.state.begin_call() == 0
    _resolve(registry, headers={"x-session-id": "two"})  # evicts "one"
    again = _resolve(registry, headers={"x-session-id": "one"})
    assert again.attempt_id != a.attempt_id, "an evicted session must not reuse its attempt id (call ids)"
    with pytest.raises(GatewayError) as info:
        _resolve(registry, unattributed="refuse")
    assert info.value.status == 400 and info.value.code == "rollout_required"


def test_retry_attempts_and_best_delta_base() -> None:
    registry = AttemptRegistry()
    first = registry.start("r1", {"task_input": 1})
    with pytest.raises(GatewayError):
        registry.start("r1", {})
    registry.finish("r1", first.attempt_id, "FAILURE")
    second = registry.start("r1", registry.start_info("r1"))
    assert second.attempt_number == 2 and second.attempt_id != first.attempt_id
    assert registry.latest_attempt_id("r1") == second.attempt_id

    ids = np.arange(40, dtype=np.uint32)
    second.remember(DeliveredCall("c0", 0, ids[:20], ids[20:30]), None)
    second.remember(DeliveredCall("c1", 1, ids[:5], ids[5:8]), SampledOutput("c1", 1, ids[5:8], {}))
    base_id, base = second.best_base(ids)
    assert base_id == "c0" and len(base) == 30
    prior = second.prior_calls()
    assert [(p.call_index, p.prompt_ids.tolist()) for p in prior] == [(1, list(range(5)))]


def test_request_json_redacts_credentials() -> None:
    doc = orjson.loads(
        request_json(
            "POST",
            "/v1/messages",
            "beta=true",
            {"Authorization": "Bearer sk-secret", "x-api-key": "k", "anthropic-beta": "b", "host": "h"},
            {"model": "m", "api_key": "inline", "metadata": {"apiKey": "x"}},
        )
    )
    assert doc["headers"] == {"authorization": REDACTED, "x-api-key": REDACTED, "anthropic-beta": "b"}
    assert doc["body"] == {"model": "m", "api_key": REDACTED, "metadata": {"apiKey": REDACTED}}
    assert doc["query"] == "beta=true"
