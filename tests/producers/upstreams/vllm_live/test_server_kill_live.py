"""A vLLM server killed (SIGKILL) while calls flow through the real gateway and weight updates land.

Two real vLLM servers behind the gateway's gated vLLM upstream (token-in via /inference/v1/generate,
so vLLM reports which weights sampled every call): the session's server, which survives, and one
started here, which is killed once version 2 is served, stays down while two more versions land, and
is restarted on the same port. The scenario is ``bench.weight_sync_kill.run_kill_scenario``, the same
one ``python -m bench.weight_sync_kill`` runs. Checked against the call records on Kafka, vLLM's own
reports and the sync's fleet state:

* the gateway routes around the dead server: good calls keep flowing on the survivor, and a request
  fails only in the documented shape (502, ``upstream_unavailable``), on the client and in its record;
* the restarted server comes back on the base weights and is brought to the current version before it
  takes traffic: the sync's update that brought it back found it at version 0 and updated it alone,
  it re-entered routing at the gate's version, and no call it served names another version;
* no call is recorded with a wrong version: every good call's recorded version equals the one vLLM
  reports for all its tokens and the gate's lease.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from safetensors.torch import load_file

from bench.weight_sync_kill import KillTimeline, Victim, run_kill_scenario
from models.policy_store import PolicyStore
from producers.gateway.text_side import ModelTextSide
from producers.sdk import AsyncRollout
from producers.upstreams.vllm import label_version, rendezvous_order, spans_from_text
from producers.upstreams.weight_gate import GatedUpstream
from testkit.gateway import RunningGateway, free_port, running_gateway
from testkit.kafka_read import first_records
from tokentrail.runtime.weight_sync import gate_upstream
from tokentrail.settings import Settings
from trainer_consumer.weight_sync import ServerStatus

from .conftest import LOGPROBS_MODE, SERVE_OPTIONS, SERVER_ENV, VLLM_ARGS
from .test_weight_sync_live import restore_base
from .vllm_server import VLLMServer, start_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

KILL_AFTER, DOWN_UPDATES, UPDATES = 2, 2, 6
WORKERS = 4
CALLS_PER_VERSION = 4


@dataclass
class ClientCall:
    """One chat call as the client saw it."""

    rollout_id: str
    prefers_victim: bool  # the victim is first in its rollout's rendezvous order
    streamed: bool
    ended: float  # time.time()
    error: dict[str, Any] | None  # the error body the client got, None for a good call
    status: int | None  # the HTTP status of a refused call; None for a good one or a stream cut mid-way


class Workers:
    """Chat calls through the gateway with the openai SDK (no SDK retries: every failure is seen), each in
    a rollout of its own; the rollout ids are picked so that every other call prefers the victim."""

    def __init__(self, gateway_url: str, model: str, servers: list[str], victim: str) -> None:
        self.gateway_url, self.model, self.servers, self.victim = gateway_url, model, servers, victim
        self.calls: list[ClientCall] = []
        self.stop = asyncio.Event()
        # A connection per rollout request: a call can outlast the gateway's keep-alive (5 s) on a loaded
        # machine, and a request sent on a connection the server is closing fails with a ReadError.
        self.http = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_keepalive_connections=0))

    def good(self) -> int:
        return sum(c.error is None for c in self.calls)

    def rollout_id(self, prefer_victim: bool) -> str:
        while True:
            candidate = f"kill-{uuid.uuid4().hex[:12]}"
            if (rendezvous_order(candidate, self.servers)[0] == self.victim) == prefer_victim:
                return candidate

    async def one(self, index: int, n: int) -> ClientCall:
        prefers_victim, streamed = n % 2 == 0, index % 2 == 0
        rollout_id = self.rollout_id(prefers_victim)
        error: dict[str, Any] | None = None
        status: int | None = None
        async with AsyncRollout(self.gateway_url, client=self.http, rollout_id=rollout_id,
                                task_input={"kill": n}) as rollout:
            client = rollout.openai_client(max_retries=0, timeout=300)
            messages = [{"role": "user", "content": f"Count to {n % 7 + 2}."}]
            try:
                if streamed:
                    stream = await client.chat.completions.create(model=self.model, messages=messages,
                                                                  max_tokens=16, temperature=1.0, stream=True)
                    async for _ in stream:
                        pass
                else:
                    await client.chat.completions.create(model=self.model, messages=messages, max_tokens=16,
                                                         temperature=1.0)
            except openai.APIStatusError as exc:  # refused before the answer began
                status, error = exc.status_code, exc.body if isinstance(exc.body, dict) else {"body": exc.body}
            except openai.APIError as exc:  # an error event inside a stream that had begun
                error = exc.body if isinstance(exc.body, dict) else {"message": exc.message}
            finally:
                await client.close()
        return ClientCall(rollout_id, prefers_victim, streamed, time.time(), error, status)

    async def run(self, index: int) -> None:
        n = 0
        while not self.stop.is_set():
            self.calls.append(await self.one(index, n))
            n += 1


def kill_group(server: VLLMServer) -> None:
    os.killpg(os.getpgid(server.process.pid), signal.SIGKILL)
    server.process.wait(timeout=60)


@contextmanager
def two_server_gateway(servers: list[str], store: PolicyStore, model_dir: Path, settings: Settings,
                       text_side: ModelTextSide, topics: dict[str, str],
                       spool: Path) -> Iterator[tuple[RunningGateway, GatedUpstream]]:
    from producers.delivery import CallPublisher
    from producers.gateway.app import create_app
    from producers.upstreams.vllm import VLLMUpstream
    from schemas.kafka.config import producer_config

    inner = VLLMUpstream(servers, model=settings.model.name, logprobs_mode=LOGPROBS_MODE, token_endpoint="generate")
    upstream = gate_upstream(inner, store, base_dir=model_dir, interval_s=0.2)
    sink = CallPublisher(producer_config(settings.kafka), spool, settings.gateway.delivery_timeout_s)
    app = create_app(settings, upstream, sink, text_side, topics=topics, close_upstream=True, policy_dir=store.root)
    with running_gateway(app) as gw:
        yield gw, upstream


def test_a_killed_vllm_server_is_routed_around_and_rejoins_at_the_current_version(
    vllm_server: VLLMServer, live_model_dir: Path, live_text_side: ModelTextSide, live_topics: dict[str, str],
    tokentrail_settings: Settings, tmp_path: Path,
) -> None:
    port = free_port()

    def start() -> VLLMServer:
        return start_vllm(live_model_dir, port, model_name=tokentrail_settings.model.name,
                          logprobs_mode=LOGPROBS_MODE, serve_options=SERVE_OPTIONS, vllm_args=VLLM_ARGS,
                          env=SERVER_ENV)

    victims = [start()]
    survivor, victim_url = vllm_server.url, victims[0].url
    store = PolicyStore(tmp_path / "policies")
    base = load_file(str(live_model_dir / "model.safetensors"))
    victim = Victim(victim_url, lambda: kill_group(victims[-1]), lambda: victims.append(start()))
    try:
        with two_server_gateway([survivor, victim_url], store, live_model_dir, tokentrail_settings,
                                live_text_side, live_topics, tmp_path / "spool") as (gw, upstream):
            workers = Workers(gw.url, tokentrail_settings.model.name, [survivor, victim_url], victim_url)
            timeline = asyncio.run(_scenario(workers, upstream, store, base, victim))
            checks = dict(upstream.checks)
        labels = {url: httpx.get(f"{url}/weight_info", timeout=30).json()["weight_version"]
                  for url in (survivor, victim_url)}
    finally:
        victims[-1].stop()
        restore_base(vllm_server, live_model_dir, PolicyStore(tmp_path / "restore"))  # shared with other tests

    records = _records(tokentrail_settings, live_topics["calls_topic"], workers.calls)
    _check_failures(workers.calls, records)
    _check_versions(records, checks)
    _check_routing_around(records, timeline, survivor, victim_url)
    _check_rejoin(records, timeline, victim_url)
    assert labels == {survivor: str(UPDATES), victim_url: str(UPDATES)}, labels  # vLLM's own /weight_info


async def _scenario(workers: Workers, upstream: GatedUpstream, store: PolicyStore, base: dict[str, Any],
                    victim: Victim) -> KillTimeline:
    tasks = [asyncio.create_task(workers.run(i)) for i in range(WORKERS)]
    try:
        timeline = await run_kill_scenario(upstream, store, base, victim, workers.good, updates=UPDATES,
                                           kill_after=KILL_AFTER, down_updates=DOWN_UPDATES,
                                           calls_per_version=CALLS_PER_VERSION)
        # Calls that prefer the restarted server go to it now: wait for a few of them to come back good.
        rejoined = timeline.rejoin().at
        deadline = time.monotonic() + 300
        while sum(c.prefers_victim and c.error is None and c.ended > rejoined for c in workers.calls) < 2:
            assert time.monotonic() < deadline, "no good calls on the restarted server"
            await asyncio.sleep(0.1)
    finally:
        workers.stop.set()
        await asyncio.gather(*tasks)
        await workers.http.aclose()
    return timeline


# ---------------------------------------------------------------------------------------------- checks

def _records(settings: Settings, topic: str, calls: list[ClientCall]) -> list[dict[str, Any]]:
    """Every CallRecord of the test's rollouts: one per client call, good or failed."""
    ids = {c.rollout_id for c in calls}
    found = [r for _, r in first_records(settings.kafka, topic, len(calls), timeout_s=120,
                                         where=lambda name, r: name == "CallRecord" and r["rollout_id"] in ids)]
    assert len(found) == len(calls), f"{len(calls)} client calls, {len(found)} call records"
    return found


def _vllm_versions(record: dict[str, Any]) -> list[int | None]:
    details = json.loads(record["sampling"]["extra_json"] or "{}").get("engine_details") or {}
    return [label_version(s.version) for s in spans_from_text(str(details.get("weight_versions", "")))]


def _gate_version(record: dict[str, Any]) -> int | None:
    details = json.loads(record["sampling"]["extra_json"] or "{}").get("engine_details") or {}
    return details.get("gate_version")


def _received(record: dict[str, Any]) -> float:
    return float(record["timings"]["received_at_us"]) / 1e6


def _ended(record: dict[str, Any]) -> float:
    return _received(record) + float(record["timings"]["total_ms"]) / 1e3


def _check_failures(calls: list[ClientCall], records: list[dict[str, Any]]) -> None:
    """A request fails only with the documented 502 ``upstream_unavailable``, on the wire and on record."""
    refused = [c for c in calls if c.error is not None]
    for call in refused:
        assert call.error is not None and call.error.get("code") == "upstream_unavailable", call
        assert call.status in (502, None), call  # None: the error event of a stream that had begun
        assert call.status == 502 or call.streamed, call
    failed = [r for r in records if r["status"] == "ERROR"]
    assert len(failed) == len(refused), (failed, refused)
    for record in failed:
        assert (record["error"]["type"], record["error"]["status_code"]) == ("upstream_unavailable", 502), record


def _check_versions(records: list[dict[str, Any]], checks: dict[str, int]) -> None:
    """Every good call's recorded version is the one vLLM reports for all its tokens, and its lease."""
    good = [r for r in records if r["status"] == "OK"]
    wrong = [(r["versions"]["policy_version"], _vllm_versions(r), _gate_version(r)) for r in good
             if not _vllm_versions(r) or {*_vllm_versions(r), _gate_version(r)} != {r["versions"]["policy_version"]}]
    assert wrong == [], wrong
    assert {r["versions"]["policy_version"] for r in good} >= set(range(1, UPDATES + 1))  # every version served
    assert checks["mismatched"] == 0 and checks["checked"] >= len(good), checks


def _check_routing_around(records: list[dict[str, Any]], timeline: KillTimeline, survivor: str,
                          victim: str) -> None:
    """The victim served calls before the kill; while it was down, good calls flowed on the survivor,
    and every update that landed then updated the survivor and failed (reported) for the victim."""
    good = [r for r in records if r["status"] == "OK"]
    assert any(r["versions"]["upstream"] == victim and _received(r) < timeline.killed_at for r in good)
    # received after the victim left routing, done before it was started again: routed while it was down
    while_down = [r for r in good
                  if timeline.left_routing_at < _received(r) and _ended(r) < timeline.restart_began_at]
    assert len(while_down) >= DOWN_UPDATES * CALLS_PER_VERSION
    assert {r["versions"]["upstream"] for r in while_down} == {survivor}
    assert {r["versions"]["policy_version"] for r in while_down} >= set(timeline.versions_while_down)
    failed_on_victim = [(r.version, r.updated) for r in timeline.reports_after_kill if victim in r.failed]
    assert failed_on_victim == [(v, [survivor]) for v in timeline.versions_while_down], failed_on_victim


def _check_rejoin(records: list[dict[str, Any]], timeline: KillTimeline, victim: str) -> None:
    """The restarted server was synced from the base weights, alone, before it entered routing, and served
    no call at any version but the one it was synced to (or a later one the whole fleet moved to)."""
    report = timeline.rejoin_report()
    rejoin = timeline.rejoin()
    assert (report.previous[victim], report.updated, report.version) == (0, [victim], rejoin.gate_version), report
    assert (rejoin.victim.status, rejoin.victim.version) == (ServerStatus.CURRENT, rejoin.gate_version), rejoin
    after_kill = [r for r in records if r["versions"]["upstream"] == victim and _received(r) > timeline.killed_at
                  and r["status"] == "OK"]  # all served after the restart: nothing listened before
    assert after_kill, "the restarted server took no call"
    served = [v for r in after_kill for v in _vllm_versions(r)]
    assert 0 not in served and min(v for v in served if v is not None) >= rejoin.gate_version, served
    last_reports = [r for r in timeline.reports_after_kill if r.version > rejoin.gate_version]
    assert last_reports and all(sorted(r.updated) == sorted(r.view.servers) for r in last_reports), last_reports
