"""Gateway authentication (issue 17): one setting, ``gateway.admin_key``, turns keys on for every route; a
presented key that is not ASCII is a wrong key (401), never a 500; ``require_auth`` is a deprecated alias.
Each refusal is followed by a good request that must still work."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from producers.gateway.attempts import AttemptRegistry
from producers.gateway.errors import GatewayError
from producers.gateway.identity import is_admin, keys_equal, resolve_call
from producers.sdk import Rollout
from tokentrail.settings import Settings

from .helpers import read_records

MODEL = "tokentrail-tiny"
USER = [{"role": "user", "content": "hi"}]
ADMIN = "admin-secret"
CHAT = {"model": MODEL, "messages": USER, "max_tokens": 2}
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}
# Header values as bytes: what a client may put on the wire (the server decodes them as latin-1).
NON_ASCII = ["Bearer ключ".encode(), "Bearer admin-secreté".encode("latin-1"), b"Bearer \xff\xfe",
             "Bearer 🔑".encode()]


def test_keys_compare_as_bytes() -> None:
    assert keys_equal("abc", "abc") and not keys_equal("abc", "abd")
    for key in ("ключ", "admin-secreté", "\udcff", "🔑", ""):
        assert not keys_equal(key, ADMIN)  # no TypeError for str arguments that are not ASCII
        assert not is_admin(key, ADMIN)
    assert keys_equal("ключ", "ключ")
    assert not is_admin(ADMIN, "") and not is_admin(None, ADMIN) and is_admin(ADMIN, ADMIN)


def test_resolve_call_treats_a_non_ascii_key_as_a_wrong_key() -> None:
    registry = AttemptRegistry()
    state = registry.start(None, {})
    path = {"rollout_id": state.rollout_id, "attempt_id": state.attempt_id}
    for admin_key, require_auth in ((ADMIN, False), ("", True), (ADMIN, True)):
        for where in ({"path": path}, {"headers": {"x-rollout-id": state.rollout_id}}, {}):
            headers = {**where.get("headers", {}), "authorization": "Bearer ключ"}
            with pytest.raises(GatewayError) as info:
                resolve_call(where.get("path", {}), headers, registry, unattributed="record",
                             require_auth=require_auth, admin_key=admin_key)
            assert info.value.status == 401
        # right after: the attempt's own key works
        good = resolve_call(path, {"authorization": f"Bearer {state.api_key}"}, registry, unattributed="record",
                            require_auth=require_auth, admin_key=admin_key)
        assert good.state is state


def test_the_admin_key_alone_protects_model_calls() -> None:
    """Without ``require_auth``: the admin key turns authentication on for model calls too."""
    registry = AttemptRegistry()
    state = registry.start(None, {})
    path = {"rollout_id": state.rollout_id, "attempt_id": state.attempt_id}

    def resolve(path_params: dict, headers: dict, unattributed: str = "record"):
        return resolve_call(path_params, headers, registry, unattributed=unattributed, require_auth=False,
                            admin_key=ADMIN)

    for path_params, headers in ((path, {}), ({}, {"x-rollout-id": state.rollout_id}), ({}, {}),
                                 (path, {"x-api-key": "sk-wrong"}), ({}, {"authorization": "Bearer sk-wrong"})):
        with pytest.raises(GatewayError) as info:
            resolve(path_params, headers)
        assert info.value.status == 401, (path_params, headers)
    assert resolve(path, {"x-api-key": state.api_key}).state is state
    assert resolve(path, {"authorization": f"Bearer {ADMIN}"}).state is state
    assert resolve({}, {"authorization": f"Bearer {state.api_key}"}).via == "api_key"
    assert resolve({}, {"authorization": f"Bearer {ADMIN}"}).via == "unattributed"  # unattributed: admin only
    with pytest.raises(GatewayError) as refused:
        resolve({}, {"authorization": f"Bearer {ADMIN}"}, unattributed="refuse")
    assert refused.value.status == 400 and refused.value.code == "rollout_required"
    other = registry.start(None, {})
    with pytest.raises(GatewayError) as denied:
        resolve(path, {"x-api-key": other.api_key})
    assert denied.value.status == 403


def test_non_ascii_keys_are_wrong_keys_on_every_route(start_gateway) -> None:
    with start_gateway(admin_key=ADMIN) as gw, Rollout(gw.url, admin_key=ADMIN) as rollout:
        attempt = f"{gw.url}/v1/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt_id}"
        for value in NON_ASCII:
            bearer = {"authorization": value}
            assert httpx.post(f"{gw.url}/v1/rollouts", json={}, headers=bearer).status_code == 401
            assert httpx.post(f"{gw.url}/v1/rollouts/{rollout.rollout_id}/attempts", json={},
                              headers=bearer).status_code == 401
            assert httpx.get(attempt, headers=bearer).status_code == 401
            assert httpx.post(f"{attempt}/events", json={"kind": "STEP"}, headers=bearer).status_code == 401
            assert httpx.post(f"{attempt}/finish", json={}, headers=bearer).status_code == 401
            for url in (f"{rollout.openai_base_url}/chat/completions", f"{gw.url}/v1/chat/completions"):
                refused = httpx.post(url, json=CHAT, headers=bearer)
                assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
            messages = httpx.post(f"{gw.url}/v1/messages", json=CHAT,
                                  headers={**ANTHROPIC_HEADERS, "x-api-key": value.removeprefix(b"Bearer ")})
            assert messages.status_code == 401 and messages.json()["error"]["type"] == "authentication_error"
            assert httpx.get(f"{gw.url}/v1/models", headers=bearer).status_code == 401
        # right after: the good requests work
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key=rollout.api_key, max_retries=0)
        assert client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2).choices
        assert rollout.event("STEP", {"n": 1})["event_index"] == 0
    assert rollout.finished is not None and rollout.finished["call_count"] == 1


def test_the_admin_key_alone_turns_authentication_on_for_every_route(
        start_gateway, topics: dict[str, str], tokentrail_settings: Settings) -> None:
    """``admin_key`` without ``require_auth``: model calls need the attempt's key (or the admin key), calls
    with no rollout need the admin key, listing models needs a valid key; health and metrics stay open."""
    with start_gateway(admin_key=ADMIN) as gw:
        assert httpx.get(f"{gw.url}/health").status_code == 200
        assert httpx.get(f"{gw.url}/metrics").status_code == 200
        assert httpx.post(f"{gw.url}/v1/rollouts", json={}).status_code == 401
        anonymous = openai.OpenAI(base_url=gw.openai_base_url, api_key="sk-someone", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            anonymous.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            anonymous.models.list()
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0).models.list()
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0).messages.count_tokens(
                model=MODEL, messages=USER)
        admin = openai.OpenAI(base_url=gw.openai_base_url, api_key=ADMIN, max_retries=0)
        assert [m.id for m in admin.models.list()] == [MODEL]
        unattributed = admin.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)  # admin: allowed
        assert unattributed.choices

        with Rollout(gw.url, admin_key=ADMIN) as rollout:
            path = f"/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt_id}"
            no_key = httpx.post(f"{gw.url}{path}/v1/chat/completions", json=CHAT)
            assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
            by_header = httpx.post(f"{gw.url}/v1/messages", json=CHAT,
                                   headers={**ANTHROPIC_HEADERS, "X-Rollout-Id": rollout.rollout_id})
            assert by_header.status_code == 401 and by_header.json()["error"]["type"] == "authentication_error"
            wrong = openai.OpenAI(base_url=rollout.openai_base_url, api_key="sk-other", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                wrong.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
            with Rollout(gw.url, admin_key=ADMIN) as other:  # isolation: a valid key of another attempt
                intruder = openai.OpenAI(base_url=rollout.openai_base_url, api_key=other.api_key, max_retries=0)
                with pytest.raises(openai.PermissionDeniedError):
                    intruder.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
            # right after: the attempt's own key, on its path and alone, and the admin key on its path
            own = rollout.openai_client(max_retries=0)
            assert own.chat.completions.create(model=MODEL, messages=USER, max_tokens=2).choices
            assert [m.id for m in own.models.list()] == [MODEL]
            by_key = anthropic.Anthropic(base_url=gw.url, api_key=rollout.api_key, max_retries=0)
            assert by_key.messages.create(model=MODEL, max_tokens=2, messages=USER).usage.output_tokens >= 1
            assert by_key.messages.count_tokens(model=MODEL, messages=USER).input_tokens > 0
            as_admin = openai.OpenAI(base_url=rollout.openai_base_url, api_key=ADMIN, max_retries=0)
            assert as_admin.chat.completions.create(model=MODEL, messages=USER, max_tokens=2).choices
        assert rollout.finished is not None and rollout.finished["call_count"] == 3
    # Nothing was recorded for the refused calls: the rollout's three calls are its whole record.
    calls = read_records(tokentrail_settings, topics["calls_topic"], 3, where={"rollout_id": rollout.rollout_id})
    assert sorted(r["call_index"] for _, r in calls) == [0, 1, 2]


def test_unattributed_refuse_still_works_with_the_admin_key(start_gateway) -> None:
    with start_gateway(admin_key=ADMIN, unattributed="refuse") as gw:
        no_key = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT)
        assert no_key.status_code == 401
        as_admin = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {ADMIN}"})
        assert as_admin.status_code == 400 and as_admin.json()["error"]["code"] == "rollout_required"
        with Rollout(gw.url, admin_key=ADMIN) as rollout:  # right after: an attributed call works
            assert rollout.openai_client(max_retries=0).chat.completions.create(
                model=MODEL, messages=USER, max_tokens=2).choices


def test_require_auth_is_a_deprecated_alias(start_gateway) -> None:
    """``require_auth`` without an admin key: every attempt route needs the attempt's own key; starting
    rollouts stays open (there is no key to check it against)."""
    with start_gateway(require_auth=True) as gw, Rollout(gw.url) as rollout:
        attempt = f"{gw.url}/v1/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt_id}"
        assert httpx.post(f"{rollout.openai_base_url}/chat/completions", json=CHAT).status_code == 401
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT).status_code == 401
        assert httpx.post(f"{attempt}/events", json={"kind": "STEP"}).status_code == 401
        assert httpx.get(f"{gw.url}/v1/models").status_code == 401
        assert rollout.openai_client(max_retries=0).chat.completions.create(
            model=MODEL, messages=USER, max_tokens=2).choices
        assert rollout.event("STEP", {"n": 1})["event_index"] == 0  # the SDK posts with the attempt's key
    assert rollout.finished is not None and rollout.finished["call_count"] == 1


def test_without_keys_the_gateway_stays_open(start_gateway) -> None:
    """The local default (loopback, no admin key): nothing needs a key."""
    with start_gateway() as gw:
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT).status_code == 200
        assert httpx.get(f"{gw.url}/v1/models").status_code == 200
        with Rollout(gw.url) as rollout:
            assert httpx.post(f"{rollout.openai_base_url}/chat/completions", json=CHAT).status_code == 200
