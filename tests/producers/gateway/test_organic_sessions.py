"""Organic sessions (sessions.py, issue 21 item 1, issue 18 item 5): calls that name no rollout but carry a
session key become a real attempt; each session window (until an explicit end or an idle gap) is a rollout
of its own, derived from the key and the window's start; the window's end finishes it with the counts, so
the assembler builds a COMPLETE rollout from the records on Kafka, one per window."""

from __future__ import annotations

import typing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anthropic
import httpx
import openai
import orjson
import pydantic
import pytest

from processors.assembler import RolloutAssembly
from producers.gateway.session_refs import DEV_SESSION_REF_KEY, SessionRefs
from producers.gateway.sessions import DEFAULT_KEY_SOURCES, KEY_SOURCES, ref_of_start, session_key
from producers.gateway.settings import GatewaySettings
from producers.gateway.text_side import ModelTextSide
from schemas.kafka.key_store import DEV_MASTER_KEY_HEX
from schemas.subject_names import SubjectNames
from testkit.gateway import embedded_gateway_app, running_gateway
from testkit.kafka_read import first_records
from tokentrail.settings import Settings

from .helpers import read_records

MODEL = "tokentrail-tiny"
REFS = SessionRefs(DEV_SESSION_REF_KEY)  # what the test gateways key session refs with (the setting's default)
SUBJECTS = SubjectNames(bytes.fromhex(DEV_MASTER_KEY_HEX))  # and subjects (forget.master_key's default)


def _chat(client: openai.OpenAI, turns: int, **extra: Any) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Say hi."}]
    for n in range(turns):
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0,
                                               **extra)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                     {"role": "user", "content": f"again ({n})"}]


def _complete(settings: Settings, topics: dict[str, str], rid: str, calls: int, env: int = 2,
              attempt_id: str | None = None) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """The session's start, calls 0..calls-1 and finish are on Kafka and assemble one COMPLETE rollout."""
    where: dict[str, Any] = {"rollout_id": rid} | ({"attempt_id": attempt_id} if attempt_id else {})
    env_records = read_records(settings, topics["env_topic"], env, where=where)
    call_records = read_records(settings, topics["calls_topic"], calls, where=where)
    assert sorted(r["call_index"] for _, r in call_records) == list(range(calls))
    assert all(r["status"] == "OK" for _, r in call_records)
    started = next(r for name, r in env_records if name == "AttemptStarted")
    finished = next(r for name, r in env_records if name == "AttemptFinished")
    assert finished["call_count"] == calls and finished["status"] == "SUCCESS"
    assembly = RolloutAssembly(rid)
    emitted = [out for name, rec in [*env_records, *call_records] for out in assembly.accept(name, rec).rollouts]
    (rollout,) = emitted
    assert rollout["status"] == "COMPLETE" and len(rollout["calls"]) == calls
    return env_records, started


def _windows(settings: Settings, topics: dict[str, str], key: str, count: int) -> list[dict[str, Any]]:
    """The AttemptStarted of the key's first ``count`` session windows, in the order they started."""
    found = first_records(settings.kafka, topics["env_topic"], count, timeout_s=60.0,
                          where=lambda name, r: name == "AttemptStarted"
                          and orjson.loads(r["metadata_json"]).get("session_ref") == REFS.ref(key))
    assert len(found) == count, f"expected {count} windows of {key!r}, found {len(found)}"
    return sorted((r for _, r in found), key=lambda r: orjson.loads(r["metadata_json"])["window_start_us"])


def test_the_session_key_comes_from_headers_then_the_body() -> None:
    both = session_key({"x-session-id": "h-1"}, {"user": "u-1"}, "openai")
    assert both == ("h-1", "header:x-session-id")  # a harness session header wins
    assert session_key({}, {"user": "u-1"}, "openai") == ("u-1", "openai.user")
    assert session_key({}, {"metadata": {"user_id": "u-2"}}, "anthropic") == ("u-2", "anthropic.metadata.user_id")
    assert session_key({}, {"metadata": {"user_id": "u-2"}}, "openai") is None  # not an OpenAI key
    assert session_key({}, {}, "openai") is None
    # One rollout per window: the key and the window's start name it; a key's windows share a prefix.
    assert REFS.rollout_id_for("h-1", 10) == REFS.rollout_id_for("h-1", 10) != REFS.rollout_id_for("h-1", 11)
    assert REFS.rollout_id_for("h-1", 10) != REFS.rollout_id_for("h-2", 10)
    assert REFS.rollout_id_for("h-1", 10).startswith(REFS.key_part("h-1") + "-")
    assert REFS.key_part("h-1").startswith("session-")
    assert REFS.key_part("h-1") != REFS.key_part("h-2")


def test_the_key_sources_are_configurable_and_an_api_key_stands_for_its_tenant_only_as_a_hash() -> None:
    headers = {"x-session-id": "h-1", "authorization": "Bearer tenant-secret-a"}
    assert session_key(headers, {"user": "u-1"}, "openai", ("openai.user", "headers")) == ("u-1", "openai.user")
    tenant, source = session_key(headers, {"user": "u-1"}, "openai", ("api_key",)) or ("", "")
    assert source == "api_key" and tenant.startswith("api-key:") and "tenant-secret-a" not in tenant
    assert session_key({"x-api-key": "tenant-secret-a"}, {}, "anthropic", ("api_key",)) == (tenant, "api_key")
    assert session_key({"authorization": "Bearer tenant-b"}, {}, "openai", ("api_key",))[0] != tenant  # type: ignore[index]
    # The operator's admin key is nobody's tenant; no key at all is no session.
    assert session_key({"authorization": "Bearer admin"}, {}, "openai", ("api_key",), admin_key="admin") is None
    assert session_key({}, {}, "openai", ("api_key",)) is None
    # The settings accept exactly the sources the gateway knows.
    field = GatewaySettings.model_fields["session_key_sources"]
    assert set(typing.get_args(typing.get_args(field.annotation)[0])) == set(KEY_SOURCES)
    assert tuple(GatewaySettings().session_key_sources) == DEFAULT_KEY_SOURCES
    with pytest.raises(pydantic.ValidationError):
        GatewaySettings(session_key_sources=["cookie"])


def test_with_the_api_key_as_the_source_each_tenant_is_a_session_of_its_own(
    start_gateway, topics: dict[str, str], tokentrail_settings: Settings
) -> None:
    with start_gateway(organic_sessions=True, session_key_sources=("api_key",)) as gw:
        for key, turns in (("tenant-a-key", 2), ("tenant-b-key", 1)):
            _chat(openai.OpenAI(base_url=gw.openai_base_url, api_key=key, max_retries=0), turns, user="ignored")
        tenants = [session_key({"authorization": f"Bearer {key}"}, {}, "openai", ("api_key",))[0]  # type: ignore[index]
                   for key in ("tenant-a-key", "tenant-b-key")]
        ended = [httpx.post(f"{gw.url}/v1/sessions/{quote(t, safe='')}/end", timeout=60) for t in tenants]
    assert [r.status_code for r in ended] == [200, 200]
    assert [r.json()["call_count"] for r in ended] == [2, 1]  # the body's `user` is not a source here
    env_records, started = _complete(tokentrail_settings, topics, ended[0].json()["rollout_id"], 2)
    assert orjson.loads(started["metadata_json"])["session_source"] == "api_key"
    assert not any(b"tenant-a-key" in orjson.dumps(r) for _, r in env_records)  # only its hash is recorded


def test_harness_sessions_with_no_rollout_become_complete_rollouts(
    start_gateway, topics: dict[str, str], tokentrail_settings: Settings
) -> None:
    with start_gateway(organic_sessions=True) as gw:
        oa = openai.OpenAI(base_url=gw.openai_base_url, api_key="x", max_retries=0,
                           default_headers={"x-session-id": "pi-organic-1"})
        _chat(oa, 3)
        an = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
        for n in range(3):
            an.messages.create(model=MODEL, max_tokens=4, metadata={"user_id": "claude-user-7"},
                               messages=[{"role": "user", "content": f"hello {n}"}])
        # Two first calls of a new session at once: one start, both calls in its attempt.
        racing = openai.OpenAI(base_url=gw.openai_base_url, api_key="x", max_retries=0,
                               default_headers={"x-session-id": "pi-racing"})
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda _: _chat(racing, 1), range(2)))
        # No session key at all: unattributed, as without organic sessions.
        bare = openai.OpenAI(base_url=gw.openai_base_url, api_key="x", max_retries=0)
        _chat(bare, 1)
        ended = [httpx.post(f"{gw.url}/v1/sessions/{quote(key, safe='')}/end", timeout=60)
                 for key in ("pi-organic-1", "claude-user-7", "pi-racing")]
        unknown = httpx.post(f"{gw.url}/v1/sessions/nobody/end", timeout=60)
        # After the end, the same key opens its next window: a rollout of its own.
        _chat(oa, 1)
        health = httpx.get(f"{gw.url}/health").json()

    assert [r.status_code for r in ended] == [200, 200, 200]
    assert [r.json()["call_count"] for r in ended] == [3, 3, 2]
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_session"  # OpenAI shape
    assert health["organic_sessions"] == {"open": 1, "started": 4, "ended": 3}  # the race started one
    for n, (key, source, windows) in enumerate((("pi-organic-1", "header:x-session-id", 2),
                                                ("claude-user-7", "anthropic.metadata.user_id", 1))):
        first = ended[n].json()
        # The key's windows are rollouts on different partitions: read them all, take the earliest.
        started = _windows(tokentrail_settings, topics, key, windows)[0]
        metadata = orjson.loads(started["metadata_json"])
        assert first["rollout_id"] == started["rollout_id"] == REFS.rollout_id_for(key,
                                                                                  metadata["window_start_us"])
        env_records, started = _complete(tokentrail_settings, topics, first["rollout_id"], 3,
                                         attempt_id=first["attempt_id"])
        assert [name for name, _ in env_records] == ["AttemptStarted", "AttemptFinished"]  # start first
        assert orjson.loads(started["task_input_json"]) == {} and started["attempt_number"] == 1
        assert metadata == {"organic": True, "session_ref": REFS.ref(key), "session_source": source,
                            "window_start_us": metadata["window_start_us"]}
        # The user's or harness's id is never stored: the subject (the handle an erasure request names) is its
        # keyed pseudonym (schemas/subject_names.py), the metadata has its keyed ref.
        assert started["subject"] == SUBJECTS.stored(key) != key
        assert key not in orjson.dumps(started).decode()
    _complete(tokentrail_settings, topics, ended[2].json()["rollout_id"], 2)  # indices 0 and 1 of one attempt
    (_, bare_call), = read_records(tokentrail_settings, topics["calls_topic"], 1, where={"session_id": None,
                                                                                         "protocol": "openai.chat"})
    assert bare_call["rollout_id"] == "unattributed"
    # The key's second window: a new rollout (attempt 1 of its own), not a second attempt of the first.
    first_window, again = _windows(tokentrail_settings, topics, "pi-organic-1", 2)
    assert first_window["rollout_id"] == ended[0].json()["rollout_id"] != again["rollout_id"]
    assert again["attempt_number"] == 1 and again["rollout_id"].startswith(REFS.key_part("pi-organic-1") + "-")
    (_, next_call), = read_records(tokentrail_settings, topics["calls_topic"], 1,
                                   where={"attempt_id": again["attempt_id"]})
    assert next_call["call_index"] == 0 and next_call["rollout_id"] == again["rollout_id"]


def test_an_idle_gap_ends_the_window_and_the_next_window_is_a_rollout_of_its_own(
    start_gateway, topics: dict[str, str], tokentrail_settings: Settings
) -> None:
    with start_gateway(organic_sessions=True, session_idle_s=0.5) as gw:
        client = openai.OpenAI(base_url=gw.openai_base_url, api_key="x", max_retries=0)
        _chat(client, 1, user="end-user-42")  # OpenAI `user`: the key
        (first,) = _windows(tokentrail_settings, topics, "end-user-42", 1)
        # No end is sent: the sweep finishes the session once it has been idle for 0.5 s.
        env_records, _ = _complete(tokentrail_settings, topics, first["rollout_id"], 1)
        finished = next(r for name, r in env_records if name == "AttemptFinished")
        assert orjson.loads(finished["final_artifacts_json"]) == {"organic": {"ended_by": "idle"}}
        _chat(client, 1, user="end-user-42")
        _, second = _windows(tokentrail_settings, topics, "end-user-42", 2)
        # Both windows are first attempts of their own rollouts, each COMPLETE on its own counts (the
        # second ends idle too, while the gateway runs), so the processors count and train on both.
        env_records, _ = _complete(tokentrail_settings, topics, second["rollout_id"], 1)
        health = httpx.get(f"{gw.url}/health").json()
    assert health["organic_sessions"] == {"open": 0, "started": 2, "ended": 2}
    assert second["rollout_id"] != first["rollout_id"] and second["attempt_number"] == first["attempt_number"] == 1
    assert [name for name, _ in env_records] == ["AttemptStarted", "AttemptFinished"]


def test_a_restarted_gateway_rebuilds_an_open_organic_session(
    tokentrail_settings: Settings, topics: dict[str, str], text_side: ModelTextSide, tmp_path: Path
) -> None:
    """Organic attempts are ordinary attempts on Kafka: a restart rebuilds them (recovery.py) and the
    session's next call continues its attempt at the next index; it still completes."""
    spool = tmp_path / "spool"

    def app() -> Any:
        return embedded_gateway_app(tokentrail_settings, spool_dir=spool, topics=topics, text=text_side,
                                    organic_sessions=True)

    headers = {"x-claude-code-session-id": "cc-restart-1"}
    with running_gateway(app()) as first:
        _chat(openai.OpenAI(base_url=first.openai_base_url, api_key="x", max_retries=0, default_headers=headers), 2)
    with running_gateway(app()) as second:
        assert httpx.get(f"{second.url}/health").json()["organic_sessions"]["open"] == 1  # adopted
        _chat(openai.OpenAI(base_url=second.openai_base_url, api_key="x", max_retries=0, default_headers=headers), 1)
        ended = httpx.post(f"{second.url}/v1/sessions/cc-restart-1/end", timeout=60).json()
    assert ended["call_count"] == 3 and ended["attempt_number"] == 1
    (started,) = _windows(tokentrail_settings, topics, "cc-restart-1", 1)  # one window across the restart
    assert ended["rollout_id"] == started["rollout_id"]
    _complete(tokentrail_settings, topics, ended["rollout_id"], 3)


def test_a_session_is_known_by_a_keyed_hash_of_its_key_and_old_starts_still_read() -> None:
    """AttemptStarted metadata carries ``session_ref``, an HMAC of the key under the operator's secret behind its
    tenant's scope, never the key (a user id) nor a plain hash of it (which anyone could compute from a guessed
    key and confirm against stored records); a window started before refs carries the key itself, and a restart
    still adopts it."""
    import hashlib

    from producers.gateway.tenants import Tenants

    key = "end-user-42"
    refs, other = SessionRefs("operator-secret-1"), SessionRefs("operator-secret-2")
    ref = refs.ref(key)
    assert ref == refs.ref(key) == SessionRefs(b"operator-secret-1").ref(key)  # stable for a key
    assert ref.startswith("hmac:") and key not in ref
    assert other.ref(key) != ref and REFS.ref(key) != ref  # differs with the secret
    # Nothing derived from the key is its plain hash, whole or cut, as refs and rollout ids were before.
    plain = hashlib.sha256(key.encode()).hexdigest()
    derived = (ref, refs.key_part(key), refs.rollout_id_for(key, 1), refs.ref(Tenants.scope("acme", key)))
    assert not any(plain[:16] in value for value in derived), derived
    assert refs.key_part(key) != other.key_part(key) and refs.rollout_id_for(key, 1) != other.rollout_id_for(key, 1)
    scoped = refs.ref(Tenants.scope("acme", key))
    assert Tenants.tenant_of_session(scoped) == "acme" and scoped != Tenants.scope("acme", ref) != ref
    assert ref_of_start({"organic": True, "session_ref": ref, "window_start_us": 1}, refs) == ref
    assert ref_of_start({"organic": True, "session": key, "window_start_us": 1}, refs) == ref  # old record
    # A ref written before refs were keyed (or under a rotated-out secret) is read as written.
    assert ref_of_start({"organic": True, "session_ref": "sha256:" + plain[:32]}, refs) == "sha256:" + plain[:32]
    assert ref_of_start({"session": key}, refs) is None and ref_of_start({"organic": True}, refs) is None
    with pytest.raises(ValueError, match="empty"):
        SessionRefs("")
    with pytest.raises(pydantic.ValidationError, match="must not be empty"):
        GatewaySettings(session_ref_key="")
