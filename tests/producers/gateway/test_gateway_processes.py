"""``tokentrail gateway --processes 2`` (supervisor.py, worker.py, peers.py): the real command, two worker
processes on one port, the embedded engine, real Kafka. Every kind of session (a multi-turn rollout named by
its path and by its minted key alone, an organic session keyed by X-Session-Id, one keyed by the tenant's
API key) is driven through the real openai / anthropic SDKs over a new connection per call, so the kernel
spreads the calls over both workers: every answer of a session comes from one worker, the calls are one
rollout each, and later prompts are deltas on the earlier call (the splice state was there). Then one
worker is killed -9: the supervisor restarts it, it rebuilds from Kafka only the attempts it owns, and an
open rollout it owns goes on where it was."""

from __future__ import annotations

import hashlib
import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from producers.gateway.sticky import mint_owned_rollout_id, owner_of
from schemas.local_paths import REPO_ROOT
from tokentrail.runtime.process import settings_env
from tokentrail.settings import Settings

from .helpers import read_records

pytestmark = pytest.mark.e2e

MODEL = "tokentrail-tiny"
TURNS = 5


@dataclass
class Gateway:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    topics: dict[str, str]
    settings: Settings
    workers: list[str] = field(default_factory=list)  # each worker's own (peer) URL

    def health(self, worker: int) -> dict[str, Any]:
        return httpx.get(f"{self.workers[worker]}/health", timeout=10).json()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(check: Any, what: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the gateway exited ({proc.returncode}): {log.read_text()[-3000:]}"
        try:
            found = check()
        except httpx.HTTPError:
            found = None
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"{what} did not happen in {timeout_s:g}s: {log.read_text()[-3000:]}")


@pytest.fixture
def gateway(tokentrail_settings: Settings, kafka_bootstrap: str, model_dir: Path, new_topic: Any,
            tmp_path: Path) -> Iterator[Gateway]:
    port = _free_port()
    g = tokentrail_settings.gateway.model_copy(update={
        "port": port, "spool_dir": tmp_path / "spool", "organic_sessions": True,
        "session_key_sources": ["headers", "api_key"]})
    settings = tokentrail_settings.model_copy(update={"gateway": g})
    topics = {"calls_topic": new_topic(partitions=2), "env_topic": new_topic(partitions=2)}
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tokentrail.cli", "gateway", "--processes", "2",
                                 "--calls-topic", topics["calls_topic"], "--env-topic", topics["env_topic"],
                                 "--log-level", "warning"], cwd=REPO_ROOT, env=settings_env(settings),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    gw = Gateway(f"http://127.0.0.1:{port}", proc, log, topics, settings)
    try:
        peers = _wait(lambda: httpx.get(f"{gw.url}/health", timeout=5).json()["worker"]["peers"], "start", proc, log)
        gw.workers = peers
        _wait(lambda: all(httpx.get(f"{p}/health", timeout=5).status_code == 200 for p in peers),
              "both workers answering", proc, log)
        yield gw
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()


def _openai(base_url: str, api_key: str = "unused", headers: dict[str, str] | None = None) -> openai.OpenAI:
    """A client with a connection of its own (a new one per call: the kernel picks the worker anew)."""
    return openai.OpenAI(base_url=base_url, api_key=api_key, default_headers=headers, max_retries=0,
                         http_client=httpx.Client(timeout=60))


def _chat_turns(clients: Iterator[openai.OpenAI], turns: int, messages: list[dict[str, Any]]) -> set[str]:
    """``turns`` more turns of a chat (``messages`` grows), each on the next client, every other one streamed;
    the workers that answered."""
    workers = set()
    for n in range(turns):
        with next(clients) as client:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=4, temperature=0, stream=n % 2 == 1)  # type: ignore
            workers.add(raw.headers["x-tokentrail-worker"])
            parsed = raw.parse()
            if n % 2:
                text = "".join(chunk.choices[0].delta.content or "" for chunk in parsed if chunk.choices)
            else:
                text = parsed.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"and then ({n})"}]
    return workers


def _opening(text: str) -> list[dict[str, Any]]:
    # Long enough that a later prompt shares more than a delta's minimum prefix with it (prompt_delta.py).
    return [{"role": "user", "content": f"{text} Before you answer, think of rivers, stones, seven orange "
                                        "tables and the quiet computation of everything that follows."}]


def _anthropic_turns(api_key: str, url: str, turns: int) -> set[str]:
    messages = _opening("Tell me a story.")
    workers = set()
    for n in range(turns):
        with anthropic.Anthropic(base_url=url, api_key=api_key, max_retries=0, timeout=60) as client:
            if n % 2:
                with client.messages.stream(model=MODEL, messages=messages, max_tokens=4) as stream:  # type: ignore
                    workers.add(stream.response.headers["x-tokentrail-worker"])
                    text = "".join(stream.text_stream)
            else:
                raw = client.messages.with_raw_response.create(model=MODEL, messages=messages,  # type: ignore
                                                               max_tokens=4)
                workers.add(raw.headers["x-tokentrail-worker"])
                text = "".join(b.text for b in raw.parse().content if b.type == "text")
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"go on ({n})"}]
    return workers


def _spliced_calls(gw: Gateway, rollout_id: str, calls: int) -> None:
    """The rollout's calls 0..calls-1 are on Kafka, each later prompt a delta on the call before it."""
    records = sorted((r for _, r in read_records(gw.settings, gw.topics["calls_topic"], calls,
                                                 where={"rollout_id": rollout_id})), key=lambda r: r["call_index"])
    assert [r["call_index"] for r in records] == list(range(calls))
    assert all(r["status"] == "OK" for r in records)
    for earlier, later in itertools.pairwise(records):
        assert later["prompt"]["base_call_id"] == earlier["call_id"], later["call_index"]
        assert later["spliced_outputs"] >= 1


def _end_session(gw: Gateway, key: str) -> str:
    response = httpx.post(f"{gw.url}/v1/sessions/{key}/end", json={}, timeout=30)
    assert response.status_code == 200, response.text  # the end reached the worker holding the window
    return str(response.json()["rollout_id"])


@pytest.mark.slow
def test_every_session_is_served_by_one_worker_and_a_killed_worker_comes_back(gateway: Gateway) -> None:
    gw = gateway
    # A rollout: started here, its turns alternately by its path prefix and by its minted key alone.
    start = httpx.post(f"{gw.url}/v1/rollouts", json={"task_input": {"q": 1}}, timeout=30).json()
    rid, key = start["rollout_id"], start["api_key"]
    clients = iter([_openai(start["openai_base_url"]) if n % 2 == 0 else _openai(f"{gw.url}/v1", key)
                    for n in range(TURNS)])
    assert _chat_turns(clients, TURNS, _opening("Say hi.")) == {str(owner_of(rid, 2))}
    finished = httpx.post(f"{gw.url}/v1/rollouts/{rid}/attempts/{start['attempt_id']}/finish", json={}, timeout=30)
    assert finished.status_code == 200 and finished.json()["call_count"] == TURNS

    # An organic session keyed by the harness's X-Session-Id, and one keyed by the tenant's API key.
    session = f"s-{uuid.uuid4().hex[:8]}"
    headers = {"X-Session-Id": session}
    by_header = _chat_turns(iter([_openai(f"{gw.url}/v1", headers=headers) for _ in range(TURNS)]), TURNS,
                            _opening("Hello."))
    tenant_key = f"sk-tenant-{uuid.uuid4().hex}"
    by_key = _anthropic_turns(tenant_key, gw.url, TURNS)
    assert len(by_header) == 1 and len(by_key) == 1, (by_header, by_key)
    header_rollout = _end_session(gw, session)
    key_rollout = _end_session(gw, "api-key:" + hashlib.sha256(tenant_key.encode()).hexdigest()[:24])

    # Each session is one rollout (a second worker would have opened a window of its own), spliced.
    for rollout_id in (rid, header_rollout, key_rollout):
        _spliced_calls(gw, rollout_id, TURNS)
    healths = [gw.health(n) for n in range(2)]
    assert sum(h["worker"]["forwarded"] for h in healths) > 0, "no call landed on the other worker"
    assert sum(h["organic_sessions"]["started"] for h in healths) == 2
    assert [h["worker"]["index"] for h in healths] == [0, 1]

    # Kill -9 a worker with an open rollout of its own; the other worker has one open too.
    victim = 0
    opened, conversations = {}, {}
    for n in (victim, 1 - victim):
        rollout_id = mint_owned_rollout_id(n, 2)
        begun = httpx.post(f"{gw.url}/v1/rollouts", json={"rollout_id": rollout_id}, timeout=30).json()
        opened[n], conversations[n] = begun, _opening("Count with me.")
        _chat_turns(iter([_openai(begun["openai_base_url"]) for _ in range(2)]), 2, conversations[n])
    old_pid = healths[victim]["worker"]["pid"]
    os.kill(old_pid, signal.SIGKILL)
    back = _wait(lambda: (h := gw.health(victim))["worker"]["pid"] != old_pid and h, "the restart", gw.proc, gw.log)
    assert back["recovery"]["restored"] == 1, back["recovery"]  # its own open rollout, not the other's
    assert f"worker {victim} (pid {old_pid}) exited on signal SIGKILL" in gw.log.read_text()
    # Calls flow again, the owned rollout where it was: its third call spliced on its second (by key alone).
    begun = opened[victim]
    clients = iter([_openai(f"{gw.url}/v1", begun["api_key"]) for _ in range(2)])
    assert _chat_turns(clients, 2, conversations[victim]) == {str(victim)}
    _spliced_calls(gw, begun["rollout_id"], 4)

    gw.proc.send_signal(signal.SIGTERM)
    assert gw.proc.wait(90) == 0
    assert "all workers stopped" in gw.log.read_text()
