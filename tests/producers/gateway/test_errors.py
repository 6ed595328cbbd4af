"""Bad input gets each protocol's own error shape and status, through the real SDKs and raw HTTP."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from producers.sdk import Rollout
from tokentrail.settings import Settings

from .helpers import read_records

MODEL = "tokentrail-tiny"
USER = [{"role": "user", "content": "hi"}]


def _openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


def _anthropic_error(response: httpx.Response, status: int, kind: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]


def test_openai_error_shapes(start_gateway, topics: dict[str, str], tokentrail_settings: Settings) -> None:
    with start_gateway(max_tokens_limit=64, max_body_bytes=64 * 1024) as gw:
        url = f"{gw.url}/v1/chat/completions"
        _openai_error(httpx.post(url, content=b'{"model": '), 400, "invalid_json")
        _openai_error(httpx.post(url, content=b'{"model": "\xff\xfe"}'), 400, "invalid_encoding")
        _openai_error(httpx.post(url, json=[1, 2]), 400, "invalid_json")
        error = _openai_error(httpx.post(url, json={"model": MODEL, "messages": "hi"}), 400)
        assert error["type"] == "invalid_request_error" and error["param"] == "messages"
        _openai_error(
            httpx.post(url, json={"model": MODEL, "messages": [{"role": "user", "content": "x" * 70_000}]}),
            413,
            "request_too_large",
        )
        _openai_error(httpx.get(f"{gw.url}/v1/nothing"), 404)
        _openai_error(httpx.get(url), 405)

        client = openai.OpenAI(base_url=gw.openai_base_url, api_key="k", max_retries=0)
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(model="gpt-9", messages=USER)
        assert info.value.code == "model_not_found" and info.value.param == "model"
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=USER, temperature=3.5)
        assert info.value.param == "temperature"
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}],
            )
        assert info.value.param == "messages.0.content.0.type"
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt=[10**9], max_tokens=2)
        assert info.value.code == "invalid_token_id"
        # A prompt that fills the model's context: no room for output is the caller's error, in its protocol.
        with pytest.raises(openai.BadRequestError, match="maximum context length is 8192") as info:
            client.completions.create(model=MODEL, prompt=[5] * 8192, max_tokens=64)
        assert info.value.code == "context_length_exceeded" and info.value.param == "prompt"
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)  # and the next call is served
    # Nothing of the refused calls reached Kafka: the one record is the good call after them.
    ((_, served),) = read_records(tokentrail_settings, topics["calls_topic"], 1)
    assert served["status"] == "OK" and served["sampling"]["max_tokens"] == 2


def test_anthropic_error_shapes(start_gateway) -> None:
    with start_gateway(max_tokens_limit=64, max_body_bytes=4096) as gw:
        url = f"{gw.url}/v1/messages"
        _anthropic_error(httpx.post(url, content=b"not json"), 400, "invalid_request_error")
        _anthropic_error(httpx.post(url, content=b"\xff"), 400, "invalid_request_error")
        _anthropic_error(
            httpx.post(url, json={"model": MODEL, "messages": USER}), 400, "invalid_request_error"
        )  # max_tokens is required
        error = _anthropic_error(
            httpx.post(url, json={"model": MODEL, "max_tokens": "ten", "messages": USER}), 400, "invalid_request_error"
        )
        assert "max_tokens" in error["message"]
        _anthropic_error(
            httpx.post(
                url, json={"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 5000}]}
            ),
            413,
            "request_too_large",
        )
        _anthropic_error(httpx.post(f"{gw.url}/v1/messages/nothing", json={}), 404, "not_found_error")
        _anthropic_error(
            httpx.post(
                f"{url}/count_tokens",
                json={"model": MODEL, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            ),
            400,
            "invalid_request_error",
        )

        client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.NotFoundError) as info:
            client.messages.create(model="claude-opus-9", max_tokens=5, messages=USER)
        assert info.value.body["error"]["type"] == "not_found_error"
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(
                model=MODEL, max_tokens=5, messages=USER, tools=[{"type": "web_search_20250305", "name": "web_search"}]
            )


def test_rollout_lifecycle_errors(start_gateway) -> None:
    with start_gateway() as gw:
        api = f"{gw.url}/v1/rollouts"
        missing = httpx.post(f"{api}/nope/attempts/nope/events", json={"kind": "STEP"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_rollout"
        assert httpx.post(f"{api}/nope/attempts/x/finish", json={}).status_code == 404
        assert httpx.post(api, json={"expected_group_size": 0}).status_code == 400
        assert httpx.post(api, json={"surprise": 1}).status_code == 400

        with Rollout(gw.url, rollout_id="fixed-id-1") as rollout:
            client = openai.OpenAI(base_url=rollout.openai_base_url, api_key="k", max_retries=0)
            client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
            base = f"{api}/{rollout.rollout_id}/attempts/{rollout.attempt_id}"
            assert httpx.post(f"{base}/events", json={"kind": "BOGUS"}).status_code == 400
            wrong = httpx.post(f"{base}/events", json={"kind": "STEP", "call_index": 5})
            assert wrong.status_code == 400 and "does not exist yet" in wrong.json()["error"]["message"]
            batch = httpx.post(
                f"{base}/events",
                json={"events": [{"kind": "step", "payload": 1}, {"kind": "ARTIFACT", "payload": {"f": "x"}}]},
            )
            assert [e["event_index"] for e in batch.json()["events"]] == [0, 1]
            assert httpx.post(api, json={"rollout_id": "fixed-id-1"}).status_code == 409  # attempt unfinished
            finished = rollout.finish("SUCCESS", {"answer": "red"})
        assert (finished["call_count"], finished["event_count"]) == (1, 2)
        again = httpx.post(f"{base}/finish", json={})
        assert again.status_code == 409 and again.json()["error"]["code"] == "attempt_finished"
        assert httpx.post(f"{base}/events", json={"kind": "STEP"}).status_code == 409
        with pytest.raises(openai.ConflictError):
            client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
        late_key = anthropic.Anthropic(base_url=gw.url, api_key=rollout.api_key, max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as info:
            late_key.messages.create(model=MODEL, max_tokens=3, messages=USER)
        assert info.value.status_code == 409 and info.value.body["type"] == "error"

        retry = httpx.post(f"{api}/fixed-id-1/attempts", json={})
        assert retry.status_code == 201 and retry.json()["attempt_number"] == 2


def test_unattributed_calls_refused_when_configured(start_gateway) -> None:
    with start_gateway(unattributed="refuse") as gw:
        client = openai.OpenAI(base_url=gw.openai_base_url, api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
        assert info.value.code == "rollout_required"


def test_admin_key_and_required_rollout_keys(start_gateway) -> None:
    with start_gateway(admin_key="admin-secret", require_auth=True) as gw:
        assert httpx.post(f"{gw.url}/v1/rollouts", json={}).status_code == 401
        anonymous = openai.OpenAI(base_url=gw.openai_base_url, api_key="sk-someone", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            anonymous.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
        with pytest.raises(openai.AuthenticationError):  # every route but /health and /metrics needs a key
            anonymous.models.list()
        as_admin = openai.OpenAI(base_url=gw.openai_base_url, api_key="admin-secret", max_retries=0)
        assert [m.id for m in as_admin.models.list()] == [MODEL]  # listing models needs a key, no rollout
        assert [m.id for m in anthropic.Anthropic(base_url=gw.url, api_key="admin-secret").models.list()] == [MODEL]

        with Rollout(gw.url, admin_key="admin-secret") as rollout:
            by_key = anthropic.Anthropic(base_url=gw.url, api_key=rollout.api_key, max_retries=0)
            assert by_key.messages.create(model=MODEL, max_tokens=2, messages=USER).usage.output_tokens >= 1
            assert [m.id for m in by_key.models.list()] == [MODEL]  # a rollout's key lists models too
            wrong = openai.OpenAI(base_url=rollout.openai_base_url, api_key="sk-other", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                wrong.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
            events = f"{gw.url}/v1/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt_id}/events"
            assert httpx.post(events, json={"kind": "STEP"}).status_code == 401
            with Rollout(gw.url, admin_key="admin-secret") as other:  # isolation: a valid key of another attempt
                intruder = openai.OpenAI(base_url=rollout.openai_base_url, api_key=other.api_key, max_retries=0)
                with pytest.raises(openai.PermissionDeniedError) as denied:
                    intruder.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
                assert denied.value.status_code == 403
                posted = httpx.post(events, json={"kind": "STEP"}, headers={"x-api-key": other.api_key})
                assert posted.status_code == 403
            rollout.event("STEP", {"n": 1})  # the SDK posts with the admin key
        assert rollout.finished is not None and rollout.finished["call_count"] == 1


def test_a_replica_that_did_not_start_the_attempt_refuses_its_calls(
    start_gateway, topics: dict[str, str], tokentrail_settings: Settings
) -> None:
    """Two gateway replicas on the same topics: a call or event routed to the replica that does not hold
    the attempt is refused (it could only give a colliding index), so the finish event's counts, stated
    by the replica that holds it, are still the whole attempt."""
    with start_gateway() as owner, start_gateway() as other, Rollout(owner.url, task_input={}) as rollout:
        rollout.openai_client().chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
        path = f"/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt_id}"
        stray = openai.OpenAI(base_url=f"{other.url}{path}/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.NotFoundError) as by_path:
            stray.chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
        by_header = httpx.post(f"{other.url}/v1/messages", json={"model": MODEL, "max_tokens": 3, "messages": USER},
                               headers={"X-Rollout-Id": rollout.rollout_id, "anthropic-version": "2023-06-01"})
        _anthropic_error(by_header, 404, "not_found_error")
        event = httpx.post(f"{other.url}/v1{path}/events", json={"kind": "STEP"})
        assert event.status_code == 404
        rollout.event("STEP", {"n": 1})
        finished = rollout.finish("SUCCESS", {})
    assert by_path.value.status_code == 404 and by_path.value.code == "unknown_rollout"
    assert (finished["call_count"], finished["event_count"]) == (1, 1)
    # Only the owner's call is on the topic: nothing was recorded for the refused ones.
    ((_, call),) = read_records(tokentrail_settings, topics["calls_topic"], 1, where={"rollout_id": rollout.rollout_id})
    assert call["call_index"] == 0
    with pytest.raises(AssertionError, match=r"expected 2 records on .*, found 1"):
        read_records(tokentrail_settings, topics["calls_topic"], 2, timeout_s=5,
                     where={"rollout_id": rollout.rollout_id})
