"""Fault (n) of issue 29: ``tokentrail gateway --processes 4`` with organic sessions, one worker killed -9
mid-window, then the whole gateway restarted; every session ends as exactly one COMPLETE rollout.

Sessions are keyed by the harness's ``X-Session-Id`` and driven through the real openai SDK over a new
connection per call (the kernel spreads them over the workers; the sticky router sends each to its session's
owner). While every session's window is open, the worker owning the most sessions is killed -9 (the
supervisor restarts it and it rebuilds the windows it owns from Kafka), the sessions go on, then the whole
gateway is stopped and started again on the same topics and port, the sessions go on, and each is ended with
``POST /v1/sessions/{key}/end``. Read back from the calls and env topics: every call of a session is in the
one rollout its end names, with indexes 0..n-1, and that rollout assembles COMPLETE (the processors' pure
core). Before the one-ownership fix (issue 29 #5) a session's window was rebuilt by a worker its calls never
reach: after the kill its rollout ended INCOMPLETE, after the restart the session split in two."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

from processors.assembler import RolloutAssembly
from reliability.faults import Progress, free_port
from reliability.results import FaultResult
from schemas.codec import Codec, DecodeError
from testkit.kafka_read import create_topics, delete_topics, lost_and_duplicated, read_records
from tokentrail.forgetting import content_codec
from tokentrail.runtime.process import settings_env
from tokentrail.settings import REPO_ROOT, Settings

NAME = "n. gateway --processes 4, organic sessions: a worker kill -9, then a full restart"
PROCESSES = 4
SESSIONS = 8
CALLS_PER_PHASE = 2  # calls of every session before the kill, after it, and after the restart
RETRY_WINDOW_S = 120.0


class Gateway:
    """``tokentrail gateway --processes 4`` as a process of its own, on private topics."""

    def __init__(self, settings: Settings, topics: dict[str, str], log: Path) -> None:
        self.settings, self.topics, self.log = settings, topics, log
        self.url = f"http://127.0.0.1:{settings.gateway.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 300.0) -> list[str]:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tokentrail.cli", "gateway", "--processes", str(PROCESSES),
                 "--calls-topic", self.topics["calls_topic"], "--env-topic", self.topics["env_topic"],
                 "--log-level", "warning"], cwd=REPO_ROOT, env=settings_env(self.settings),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        peers = self.wait(lambda: httpx.get(f"{self.url}/health", timeout=5).json()["worker"]["peers"], "start",
                          timeout_s)
        self.wait(lambda: all(httpx.get(f"{p}/health", timeout=5).status_code == 200 for p in peers),
                  "every worker answering", timeout_s)
        return list(peers)

    def wait(self, check: Any, what: str, timeout_s: float = 300.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited before it could {what}: {self.log.read_text()[-2000:]}")
            try:
                found = check()
            except (httpx.HTTPError, KeyError, ValueError):
                found = None
            if found:
                return found
            time.sleep(0.3)
        raise RuntimeError(f"the gateway did not {what} within {timeout_s:g}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(30)


class OrganicSession:
    """A harness's chat keyed by X-Session-Id; each call on a new connection, retried while unreachable."""

    def __init__(self, model: str, key: str) -> None:
        self.model, self.key = model, key
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": f"Count with me ({key}): one."}]
        self.answered: list[str] = []
        self.workers: list[str] = []
        self.retries = 0

    def call(self, url: str) -> None:
        import openai

        deadline = time.monotonic() + RETRY_WINDOW_S
        while True:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                                   default_headers={"X-Session-Id": self.key}, http_client=httpx.Client(timeout=60))
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model=self.model, messages=self.messages, max_tokens=4, temperature=0)  # type: ignore[arg-type]
                break
            except (openai.APIConnectionError, openai.InternalServerError):
                if time.monotonic() > deadline:
                    raise
                self.retries += 1
                time.sleep(0.3)
            finally:
                client.close()
        reply = raw.parse()
        self.workers.append(raw.headers.get("x-tokentrail-worker", "?"))
        self.answered.append(reply.id.removeprefix("chatcmpl-"))
        self.messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                          {"role": "user", "content": f"next ({len(self.answered)})"}]


def _end(url: str, key: str) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/sessions/{key}/end", json={}, timeout=60)
    response.raise_for_status()
    return dict(response.json())


def organic_sessions_fault(settings: Settings, workdir: Path, progress: Progress,
                           sessions: int = SESSIONS) -> FaultResult:
    began = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    topics = {"calls_topic": f"reliability.sessions-{tag}.calls", "env_topic": f"reliability.sessions-{tag}.env"}
    config = settings.kafka.client_config()
    create_topics(config, list(topics.values()), partitions=PROCESSES)
    gw_settings = settings.gateway.model_copy(update={
        "host": "127.0.0.1", "port": free_port(), "spool_dir": workdir / "spool", "admin_key": "",
        "organic_sessions": True, "session_key_sources": ["headers"]})
    gateway = Gateway(settings.model_copy(update={"gateway": gw_settings}), topics, workdir / "gateway.log")
    chats = [OrganicSession(settings.model.name, f"fault-n-{tag}-{n}") for n in range(sessions)]
    ends: dict[str, dict[str, Any]] = {}
    phases: list[str] = []
    try:
        peers = gateway.start()
        progress(f"fault n: {PROCESSES} workers up ({time.monotonic() - began:.0f}s)")
        for _ in range(CALLS_PER_PHASE):
            for chat in chats:
                chat.call(gateway.url)
        owners = Counter(chat.workers[-1] for chat in chats)
        victim = int(owners.most_common(1)[0][0])
        old_pid = httpx.get(f"{peers[victim]}/health", timeout=10).json()["worker"]["pid"]
        gateway_pid = gateway.proc.pid if gateway.proc else 0
        os.kill(old_pid, signal.SIGKILL)
        back = gateway.wait(lambda: (h := httpx.get(f"{peers[victim]}/health", timeout=5).json())["worker"]["pid"]
                            != old_pid and h, "restart the killed worker")
        phases.append(f"worker {victim} (owner of {owners[str(victim)]} sessions) killed -9, "
                      f"restored {back['recovery']['restored']}")
        progress(f"fault n: {phases[-1]}")
        for _ in range(CALLS_PER_PHASE):
            for chat in chats:
                chat.call(gateway.url)
        stopped = gateway.stop()
        gateway.start()
        phases.append(f"gateway {gateway_pid} stopped (exit {stopped}) and started again")
        progress(f"fault n: {phases[-1]}")
        for _ in range(CALLS_PER_PHASE):
            for chat in chats:
                chat.call(gateway.url)
        ends = {chat.key: _end(gateway.url, chat.key) for chat in chats}
    except Exception as exc:  # a scenario that cannot go on is a failed fault, with what happened so far
        phases.append(f"stopped: {exc!r}"[:300])
    finally:
        gateway.stop()
    expected = {c for chat in chats for c in chat.answered} | {e["event_id"] for e in ends.values()}
    try:
        # Organic sessions have subjects: their content is sealed; read it as the processors would.
        with content_codec(settings) as codec:
            named = [_decoded(codec, raw)
                     for raw, _ in read_records(config, list(topics.values()), expected, timeout_s=60)]
    finally:
        delete_topics(config, list(topics.values()))
    records = [r for _, r in named]
    counts = Counter(r.get("event_id", "<undecodable>") for r in records)
    lost, duplicated = lost_and_duplicated(counts, expected)
    rollouts_of: dict[str, set[str]] = defaultdict(set)
    calls_of: dict[str, list[int]] = defaultdict(list)
    by_call = {r["call_id"]: r for r in records if "call_index" in r and "call_id" in r}
    for chat in chats:
        for call_id in chat.answered:
            if call_id in by_call:
                rollouts_of[chat.key].add(by_call[call_id]["rollout_id"])
    for r in by_call.values():
        calls_of[r["rollout_id"]].append(r["call_index"])
    whole = [chat.key for chat in chats if chat.key in ends and rollouts_of[chat.key] == {ends[chat.key]["rollout_id"]}
             and sorted(calls_of[ends[chat.key]["rollout_id"]]) == list(range(len(chat.answered)))]
    complete = [key for key in whole if _complete(named, ends[key]["rollout_id"])]
    split = sum(len(rollouts_of[chat.key]) > 1 for chat in chats)
    passed = lost == duplicated == 0 and len(complete) == len(chats) and len(phases) == 2
    detail = "; ".join([*phases, f"{len(complete)} of {len(chats)} sessions one COMPLETE rollout",
                        f"{split} split over several rollouts", f"{sum(c.retries for c in chats)} client retries"])
    progress(f"fault n: lost {lost}, duplicated {duplicated}; {detail}")
    return FaultResult(NAME, f"{len(chats)} sessions, {sum(len(c.answered) for c in chats)} calls over "
                       f"{PROCESSES} workers; one killed -9, then the gateway restarted", lost, duplicated, passed,
                       detail, seconds=time.monotonic() - began)


def _complete(named: list[tuple[str, dict[str, Any]]], rollout_id: str) -> bool:
    """The rollout the processors' pure core makes of the records is COMPLETE."""
    state = RolloutAssembly(rollout_id)
    mine = [(name, r) for name, r in named if r.get("rollout_id") == rollout_id]
    emitted = [out for name, record in mine for out in state.accept(name, record).rollouts]
    return bool(emitted) and emitted[0]["status"] == "COMPLETE"


def _decoded(codec: Codec, value: bytes) -> tuple[str, dict[str, Any]]:
    try:
        return codec.decode(value)
    except DecodeError:
        return "<undecodable>", {}
