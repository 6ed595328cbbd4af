"""Organic sessions (sessions.py, issue 21 item 1, issue 18 item 5): calls that name no rollout but carry a
session key become a real attempt of a rollout derived from the key; the session's end (explicit, or idle)
finishes it with the counts, so the assembler builds a COMPLETE rollout from the records on Kafka."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anthropic
import httpx
import openai
import orjson

from processors.assembler import RolloutAssembly
from producers.gateway.sessions import rollout_id_for, session_key
from producers.gateway.testing import embedded_gateway_app, running_gateway
from producers.gateway.text_side import ModelTextSide
from tokentrail.settings import Settings

from .helpers import read_records

MODEL = "tokentrail-tiny"


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


def test_the_session_key_comes_from_headers_then_the_body() -> None:
    both = session_key({"x-session-id": "h-1"}, {"user": "u-1"}, "openai")
    assert both == ("h-1", "header:x-session-id")  # a harness session header wins
    assert session_key({}, {"user": "u-1"}, "openai") == ("u-1", "openai.user")
    assert session_key({}, {"metadata": {"user_id": "u-2"}}, "anthropic") == ("u-2", "anthropic.metadata.user_id")
    assert session_key({}, {"metadata": {"user_id": "u-2"}}, "openai") is None  # not an OpenAI key
    assert session_key({}, {}, "openai") is None
    assert rollout_id_for("h-1") == rollout_id_for("h-1") != rollout_id_for("h-2")
    assert rollout_id_for("h-1").startswith("session-")


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
        # After the end, the same key starts the rollout's next attempt.
        _chat(oa, 1)
        health = httpx.get(f"{gw.url}/health").json()

    assert [r.status_code for r in ended] == [200, 200, 200]
    assert [r.json()["call_count"] for r in ended] == [3, 3, 2]
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_session"  # OpenAI shape
    assert health["organic_sessions"] == {"open": 1, "started": 4, "ended": 3}  # the race started one
    for key, source in (("pi-organic-1", "header:x-session-id"), ("claude-user-7", "anthropic.metadata.user_id")):
        rid = rollout_id_for(key)
        first = ended[0 if key == "pi-organic-1" else 1].json()
        assert first["rollout_id"] == rid
        env_records, started = _complete(tokentrail_settings, topics, rid, 3, attempt_id=first["attempt_id"])
        assert [name for name, _ in env_records] == ["AttemptStarted", "AttemptFinished"]  # start first
        assert orjson.loads(started["task_input_json"]) == {} and started["attempt_number"] == 1
        assert orjson.loads(started["metadata_json"]) == {"organic": True, "session": key, "session_source": source}
    _complete(tokentrail_settings, topics, rollout_id_for("pi-racing"), 2)  # indices 0 and 1 of one attempt
    (_, bare_call), = read_records(tokentrail_settings, topics["calls_topic"], 1, where={"session_id": None,
                                                                                         "protocol": "openai.chat"})
    assert bare_call["rollout_id"] == "unattributed"
    (_, again), = read_records(tokentrail_settings, topics["env_topic"], 1,
                               where={"rollout_id": rollout_id_for("pi-organic-1"), "attempt_number": 2})
    (_, next_call), = read_records(tokentrail_settings, topics["calls_topic"], 1,
                                   where={"attempt_id": again["attempt_id"]})
    assert next_call["call_index"] == 0 and again["attempt_id"] != ended[0].json()["attempt_id"]


def test_an_idle_session_ends_by_itself_and_its_key_starts_the_next_attempt(
    start_gateway, topics: dict[str, str], tokentrail_settings: Settings
) -> None:
    with start_gateway(organic_sessions=True, session_idle_s=0.5) as gw:
        client = openai.OpenAI(base_url=gw.openai_base_url, api_key="x", max_retries=0)
        _chat(client, 1, user="end-user-42")  # OpenAI `user`: the key
        rid = rollout_id_for("end-user-42")
        # No end is sent: the sweep finishes the session once it has been idle for 0.5 s.
        env_records, started = _complete(tokentrail_settings, topics, rid, 1)
        finished = next(r for name, r in env_records if name == "AttemptFinished")
        assert orjson.loads(finished["final_artifacts_json"]) == {"organic": {"ended_by": "idle"}}
        _chat(client, 1, user="end-user-42")
    (_, second), = read_records(tokentrail_settings, topics["env_topic"], 1,
                                where={"rollout_id": rid, "attempt_number": 2})
    assert second["attempt_id"] != started["attempt_id"]


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
    _complete(tokentrail_settings, topics, rollout_id_for("cc-restart-1"), 3)
