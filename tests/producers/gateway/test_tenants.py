"""Tenants of organic traffic (tenants.py, issue 29 #6), through the real gateway, the openai SDK and the
broker, with the admin key set: a tenant key makes calls that name no rollout, its sessions complete, its
feedback on its own rollout reaches Kafka; another tenant cannot join, end or post feedback on them (its
call with the same X-Session-Id is a window of its own; its end is a 404, its feedback a 403); the first
tenant's calls after those attempts still reach Kafka; a tenant's open sessions are capped (429)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from processors.assembler import RolloutAssembly
from producers.gateway.keys import owner_key
from producers.gateway.session_refs import DEV_SESSION_REF_KEY, SessionRefs, is_tenant_window
from producers.gateway.tenants import Tenants
from schemas.feedback import split_call_ref
from schemas.topics import FEEDBACK_TOPIC
from tokentrail.settings import Settings

from .helpers import read_records

MODEL = "tokentrail-tiny"
ADMIN = "admin-key-for-tenancy"
KEYS = (("acme", "sk-acme-tenant"), ("blue", "sk-blue-tenant"))
REFS = SessionRefs(DEV_SESSION_REF_KEY)  # what the test gateways key session refs with (the default)


def _client(gw: Any, key: str, session: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.openai_base_url, api_key=key, max_retries=0,
                         default_headers={"x-session-id": session})


def _call(client: openai.OpenAI, text: str) -> str:
    """The call ref the response id carries: a tenant's is its call id and its tenant's tag."""
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                           max_tokens=4, temperature=0)
    return reply.id.removeprefix("chatcmpl-")


def _cid(call_ref: str) -> str:
    return split_call_ref(call_ref)[0]


def _end(gw: Any, key: str, session: str) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/sessions/{session}/end", json={}, timeout=60,
                      headers={"Authorization": f"Bearer {key}"})


def _feedback(gw: Any, key: str, rollout_id: str, target: str = "rollout_id") -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/feedback", timeout=60, headers={"Authorization": f"Bearer {key}"},
                      json={"target": {target: rollout_id}, "kind": "rating", "rating": 4,
                            "rating_scale": [1, 5]})


def test_tenant_keys_work_with_the_admin_key_and_keep_sessions_and_feedback_to_their_tenant(
    start_gateway, topics: dict[str, str], tokentrail_settings: Settings
) -> None:
    acme, blue = KEYS[0][1], KEYS[1][1]
    with start_gateway(organic_sessions=True, admin_key=ADMIN, tenant_keys=KEYS,
                       tenant_max_open_sessions=2) as gw:
        # No key, or a made-up one: refused as before (calls naming no rollout need a known key).
        with pytest.raises(openai.AuthenticationError):
            _call(_client(gw, "sk-nobody", "s1"), "hello")
        rl = httpx.post(f"{gw.url}/v1/rollouts", json={"task_input": {}}, timeout=60,
                        headers={"Authorization": f"Bearer {ADMIN}"}).json()  # an RL attempt, idle meanwhile
        a = _client(gw, acme, "s1")
        first = [_call(a, "hello"), _call(a, "and again")]
        # Blue sends acme's session id: a window of its own, not a join of acme's.
        blue_call = _call(_client(gw, blue, "s1"), "let me in")
        # Each tenant's calls carry its session id in its own namespace (what SESSION feedback joins by).
        rollouts = {r["call_id"]: r["rollout_id"] for tenant, count in (("acme", 2), ("blue", 1)) for _, r in
                    read_records(tokentrail_settings, topics["calls_topic"], count,
                                 where={"session_id": REFS.ref(Tenants.scope(tenant, "s1"))})}
        acme_rollout = rollouts[_cid(first[0])]
        assert rollouts[_cid(first[1])] == acme_rollout != rollouts[_cid(blue_call)]
        assert all(split_call_ref(ref)[1] for ref in (*first, blue_call))  # tenants' responses carry a tag
        # Blue cannot post feedback on acme's rollout, call or response, nor on a plain rollout.
        refused = [_feedback(gw, blue, acme_rollout), _feedback(gw, blue, first[0], "call_id"),
                   _feedback(gw, blue, f"chatcmpl-{first[0]}", "response_id"), _feedback(gw, blue, rl["rollout_id"]),
                   _feedback(gw, blue, _cid(first[0]), "call_id")]
        assert [r.status_code for r in refused] == [403] * 5
        assert {r.json()["error"]["code"] for r in refused} == {"wrong_tenant"}  # the caller's protocol
        # Acme may, on each of its own: the rollout, a call, a response, its session (taken in its namespace).
        good = _feedback(gw, acme, acme_rollout)
        own = [_feedback(gw, acme, first[0], "call_id"), _feedback(gw, acme, f"chatcmpl-{first[1]}", "response_id"),
               _feedback(gw, acme, "s1", "session_id"), _feedback(gw, blue, "s1", "session_id")]
        assert good.status_code == 201 and [r.status_code for r in own] == [201] * 4, [r.text for r in own]
        assert _feedback(gw, acme, _cid(first[0]), "call_id").status_code == 201  # a bare id, where it was served
        # ... each published as the keyed ref its calls record (the session id itself is nowhere stored).
        targets = [r.json()["target_id"] for r in own[2:]]
        assert targets == [REFS.ref(Tenants.scope("acme", "s1")), REFS.ref(Tenants.scope("blue", "s1"))]
        assert targets[0].startswith("tenant:acme:hmac:") and "s1" not in targets[0]
        # Blue ends "s1": its own window; acme's is still open and takes acme's next call.
        blue_end = _end(gw, blue, "s1")
        assert blue_end.status_code == 200 and blue_end.json()["rollout_id"] == rollouts[_cid(blue_call)]
        assert _end(gw, blue, "s1").status_code == 404  # nothing of blue's left; acme's is not visible to it
        after = _call(a, "still mine")
        acme_end = _end(gw, acme, "s1")
        # The cap: acme may hold 2 open windows here; a third is refused, and RL attempts are not touched.
        capped = [_call(_client(gw, acme, f"cap-{n}"), "hi") for n in range(2)]
        with pytest.raises(openai.RateLimitError) as over:
            _call(_client(gw, acme, "cap-2"), "one too many")
        assert over.value.body["code"] == "tenant_session_limit"  # type: ignore[index]
        rl_call = openai.OpenAI(base_url=gw.openai_base_url, api_key=rl["api_key"], max_retries=0)
        assert _call(rl_call, "the RL attempt still answers")  # organic starts did not push it out
    # A gateway that never served the session (another worker of --processes N, or this one restarted: the
    # feedback route is served wherever it lands): the rollout's tenant is told from its id alone, and a
    # call's from its call ref (the response id); a bare call id is known only where it was served: elsewhere
    # it is refused, and the message says what to send instead.
    with start_gateway(organic_sessions=True, admin_key=ADMIN, tenant_keys=KEYS) as fresh:
        elsewhere = [_feedback(fresh, acme, acme_rollout), _feedback(fresh, blue, acme_rollout),
                     _feedback(fresh, acme, _cid(first[0]), "call_id"),
                     _feedback(fresh, acme, first[0], "call_id"),
                     _feedback(fresh, acme, f"chatcmpl-{first[1]}", "response_id"),
                     _feedback(fresh, blue, f"chatcmpl-{first[1]}", "response_id"),
                     _feedback(fresh, blue, f"chatcmpl-{_cid(first[1])}.{'0' * 16}", "response_id")]
    assert [r.status_code for r in elsewhere] == [201, 403, 403, 201, 201, 403, 403], [r.text for r in elsewhere]
    assert "name its rollout" in elsewhere[2].json()["error"]["message"]
    (_, by_response), = read_records(tokentrail_settings, FEEDBACK_TOPIC, 1,
                                     where={"event_id": elsewhere[4].json()["event_id"]})
    assert by_response["call_id"] == _cid(first[1])  # the join finds the call by its id
    assert acme_end.status_code == 200 and acme_end.json()["rollout_id"] == acme_rollout
    assert acme_end.json()["call_count"] == 3
    where = {"rollout_id": acme_rollout}
    records = [*read_records(tokentrail_settings, topics["env_topic"], 2, where=where),
               *read_records(tokentrail_settings, topics["calls_topic"], 3, where=where)]
    assert {r["call_id"] for name, r in records if name == "CallRecord"} == {_cid(c) for c in (*first, after)}
    assembly = RolloutAssembly(acme_rollout)
    (rollout,) = [out for name, r in records for out in assembly.accept(name, r).rollouts]
    assert rollout["status"] == "COMPLETE"
    (_, stored), = read_records(tokentrail_settings, FEEDBACK_TOPIC, 1, where={"event_id": good.json()["event_id"]})
    assert stored["target_id"] == acme_rollout
    assert len(capped) == 2


def test_a_tenant_key_and_its_scope() -> None:
    tenants = Tenants(dict(KEYS), max_open_sessions=1)
    assert tenants.of("sk-acme-tenant") == "acme" and tenants.of("sk-acme-tenan") is None and tenants.of(None) is None
    scoped = Tenants.scope("acme", "s1")
    assert Tenants.tenant_of_session(scoped) == "acme" and Tenants.tenant_of_session("s1") is None
    tenants.open["acme"] = 1
    with pytest.raises(Exception, match="open sessions"):
        tenants.check_room("acme")
    with pytest.raises(ValueError, match="empty key"):
        Tenants({"x": ""})
    with pytest.raises(ValueError, match="without ':'"):
        Tenants({"a:b": "k"})
    # Routed by the key its calls carry: a scoped key's windows start with the unscoped key's part (one owner
    # with --processes N), yet two tenants' windows of one session id are different rollouts.
    assert Tenants.unscoped(scoped) == "s1" and Tenants.unscoped("s1") == "s1"
    refs = REFS
    assert refs.key_part(scoped) == refs.key_part("s1")
    assert refs.rollout_id_for(scoped, 1) != refs.rollout_id_for(Tenants.scope("blue", "s1"), 1) \
        != refs.rollout_id_for("s1", 1)
    # A tenant's window names its tenant in a keyed tag: told from the id alone, by any process with the secret
    # (owner_key still routes it by its key part), and not forgeable by changing the tag or the window part.
    window = refs.rollout_id_for(scoped, 1)
    assert refs.owned_by(window, "acme") and not refs.owned_by(window, "blue")
    assert owner_key(window) == refs.key_part("s1") and is_tenant_window(window)
    plain = refs.rollout_id_for("s1", 1)
    assert not refs.owned_by(plain, "acme") and not is_tenant_window(plain)
    forged = [window[:-1] + ("0" if window[-1] != "0" else "1"), refs.rollout_id_for(scoped, 2)[:41] + window[41:]]
    assert not any(refs.owned_by(f, "acme") for f in forged)
    assert not SessionRefs("another-secret").owned_by(window, "acme")


def test_a_caller_without_a_tenant_key_cannot_name_itself_into_a_tenants_session(
    start_gateway, topics: dict[str, str], tokentrail_settings: Settings
) -> None:
    """Tenant keys with auth off: a caller with no key that sends acme's scoped session key (``tenant:acme:s1``,
    which is what acme's own calls are filed under) in a session header, the OpenAI ``user``, the Anthropic
    ``metadata.user_id`` or an end request is refused 403 ``wrong_tenant`` in its protocol; a tenant that sends
    it gets a window in its own namespace. Acme's window is untouched: its next call continues it, and acme's
    end counts its two calls."""
    acme, blue = KEYS[0][1], KEYS[1][1]
    spoof = Tenants.scope("acme", "s1")
    chat = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with start_gateway(organic_sessions=True, tenant_keys=KEYS) as gw:
        a = _client(gw, acme, "s1")
        mine = _call(a, "hello")
        refused = [httpx.post(f"{gw.url}/v1/chat/completions", json=chat, headers={"x-session-id": spoof},
                              timeout=60),
                   httpx.post(f"{gw.url}/v1/chat/completions", json={**chat, "user": spoof}, timeout=60),
                   httpx.post(f"{gw.url}/v1/messages", json={**chat, "metadata": {"user_id": spoof}}, timeout=60,
                              headers={"anthropic-version": "2023-06-01"}),
                   httpx.post(f"{gw.url}/v1/sessions/{spoof}/end", json={}, timeout=60)]
        blue_call = _call(_client(gw, blue, spoof), "a key that looks like acme's")
        after = _call(a, "still mine")
        acme_end = _end(gw, acme, "s1")
        # Nor may it post feedback on acme's rollout, session or call (keys are off: anyone may post feedback).
        keyless = [httpx.post(f"{gw.url}/v1/feedback", timeout=60, json={"target": target, "kind": "binary",
                                                                        "binary": False})
                   for target in ({"rollout_id": acme_end.json()["rollout_id"]}, {"session_id": spoof},
                                  {"call_id": mine})]
    assert [r.status_code for r in keyless] == [403] * 3, [r.text for r in keyless]
    assert {r.json()["error"]["code"] for r in keyless} == {"wrong_tenant"}
    assert [r.status_code for r in refused] == [403, 403, 403, 403], [r.text for r in refused]
    assert [r.json()["error"].get("code") for r in refused[:2] + refused[3:]] == ["wrong_tenant"] * 3
    assert refused[2].json()["error"]["type"] == "permission_error"  # Anthropic's shape
    assert acme_end.status_code == 200 and acme_end.json()["call_count"] == 2
    # The refused calls left nothing: the first three records are the three calls served.
    calls = {r["call_id"]: r["rollout_id"] for _, r in read_records(tokentrail_settings, topics["calls_topic"], 3)}
    assert set(calls) == {_cid(mine), _cid(after), _cid(blue_call)}
    assert calls[_cid(mine)] == calls[_cid(after)] == acme_end.json()["rollout_id"] != calls[_cid(blue_call)]
