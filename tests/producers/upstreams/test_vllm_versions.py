"""Several versions on a vLLM fleet, one per server: which server serves which version, when a moved server
takes calls, what a call for a version no server holds gets.

The assignment is pure. The routing tests use stand-ins for the servers (a client per server that answers
with the version its server holds, a loader that records loads), because they are about this router's
order of events; the real servers, the real loads and vLLM's own version report are in
tests/producers/upstreams/vllm_live/test_release_servers_live.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from producers.upstreams.base import GenerateRequest, GenerateResult, Sampling, UpstreamError
from producers.upstreams.vllm_versions import Assignment, VersionedVLLMUpstream, assign_servers

A, B, C = "http://a", "http://b", "http://c"


@pytest.mark.parametrize("holding, versions, expected", [
    # a release starts: the fleet serves 1; the candidate takes one server, the serving version keeps the rest
    ({A: 1, B: 1, C: 1}, {1, 2}, Assignment({A: 1, B: 1, C: 2}, frozenset())),
    # a rollback: the candidate's server goes back to the serving version
    ({A: 1, B: 1, C: 2}, {1}, Assignment({A: 1, B: 1, C: 1}, frozenset())),
    # a promotion: every server to the candidate, the one that holds it stays
    ({A: 1, B: 1, C: 2}, {2}, Assignment({A: 2, B: 2, C: 2}, frozenset())),
    # a pinned version beside serving and candidate: each version a server of its own
    ({A: 1, B: 1, C: 2}, {1, 2, 5}, Assignment({A: 1, B: 5, C: 2}, frozenset())),
    # fresh servers (the base model, version 0, is not served): the lower version gets the spare one
    ({A: 0, B: 0, C: None}, {1, 2}, Assignment({A: 1, B: 2, C: 1}, frozenset())),
    # more versions than servers: the ones held keep their server, the others are unserved
    ({A: 1, B: 2}, {1, 2, 3}, Assignment({A: 1, B: 2}, frozenset({3}))),
    # no release: the release holds nothing
    ({A: 1, B: 2}, set(), Assignment({}, frozenset())),
])
def test_each_version_gets_servers_with_as_few_reloads_as_possible(
        holding: dict[str, int | None], versions: set[int], expected: Assignment) -> None:
    assert assign_servers([s for s in (A, B, C) if s in holding], holding, versions) == expected


class Fleet:
    """Stand-ins: each server's weights version, its clients' calls, and a loader whose loads can be held."""

    def __init__(self, versions: dict[str, int]) -> None:
        self.versions = versions
        self.loads: list[tuple[str, int]] = []
        self.load_gate = asyncio.Event()
        self.load_gate.set()
        self.call_gate = asyncio.Event()
        self.call_gate.set()
        self.served: list[tuple[str, int]] = []  # (server, version) of each call, when it ran
        self.lock = asyncio.Lock()  # the fleet updates' lock (the trainer's sync takes it for each update)

    async def load(self, server: str, version: int) -> None:
        await self.load_gate.wait()
        self.loads.append((server, version))
        self.versions[server] = version

    async def version_of(self, server: str) -> int | None:
        return self.versions[server]

    def exclusive(self) -> asyncio.Lock:
        return self.lock

    def client(self, server: str) -> Client:
        return Client(self, server)


class Client:
    def __init__(self, fleet: Fleet, server: str) -> None:
        self.fleet, self.server = fleet, server

    def set_policy_version(self, version: int) -> None:
        return None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        version = self.fleet.versions[self.server]  # what "vLLM" reports: the weights it holds when it runs
        self.fleet.served.append((self.server, version))
        await self.fleet.call_gate.wait()
        return GenerateResult(request.prompt_ids, [1], [-0.1], "length", "PROCESSED", version, "stand-in",
                              self.server)

    async def close(self) -> None:
        return None


def request(session: str, version: int | None) -> GenerateRequest:
    return GenerateRequest(np.array([1, 2, 3], dtype=np.uint32), Sampling(max_tokens=1), f"req-{session}",
                           rollout_id=session, policy_version=version, session_key=session)


def test_a_moved_server_takes_its_versions_calls_only_once_loaded_and_only_after_its_calls_finish() -> None:
    async def scenario() -> None:
        fleet = Fleet({A: 1, B: 1})
        upstream = VersionedVLLMUpstream([A, B], fleet, make_client=fleet.client, wait_s=30.0)
        fleet.load_gate.clear()
        await upstream.serve_versions({1, 2})  # B moves to 2; its load is held
        call = asyncio.create_task(upstream.generate(request("s-cand", 2)))
        await asyncio.sleep(0.05)
        assert not call.done() and fleet.served == []  # waits for a server that holds version 2
        assert upstream.held_servers() == {A, B} and upstream.resident_versions() == {1}
        served_v1 = [await upstream.generate(request(f"s{i}", 1)) for i in range(6)]
        assert {r.upstream for r in served_v1} == {A}  # version 1 only where it is held
        fleet.load_gate.set()
        result = await call
        assert (result.upstream, result.policy_version) == (B, 2) and fleet.loads == [(B, 2)]

        # A rollback moves B back, but not under its running call: the load waits for it.
        fleet.call_gate.clear()
        running = asyncio.create_task(upstream.generate(request("s-cand", 2)))
        await asyncio.sleep(0.05)
        await upstream.serve_versions({1})
        await asyncio.sleep(0.05)
        assert fleet.loads == [(B, 2)]  # B still runs its version-2 call
        fleet.call_gate.set()
        assert (await running).policy_version == 2
        await upstream.settled()
        assert fleet.loads == [(B, 2), (B, 1)] and upstream.resident_versions() == {1}
        after = await upstream.generate(request("s-cand", 1))
        assert after.policy_version == 1
        assert upstream.checks == {"checked": 9, "mismatched": 0} and upstream.errors == []
        await upstream.close()

    asyncio.run(scenario())


def test_a_version_no_server_holds_is_a_503_and_calls_naming_none_go_to_the_servers_the_release_leaves() -> None:
    async def scenario() -> None:
        fleet = Fleet({A: 1, B: 3})
        upstream = VersionedVLLMUpstream([A, B], fleet, make_client=fleet.client, wait_s=0.2)
        with pytest.raises(UpstreamError) as refused:  # no release yet: nothing held
            await upstream.generate(request("s", 1))
        assert (refused.value.status_code, refused.value.error_type) == (503, "policy_version_unavailable")
        assert "policy version 1" in str(refused.value)
        async with fleet.lock:  # the trainer's sync is updating servers: the release takes none meanwhile
            await upstream.serve_versions({1})  # the release will hold A and B for version 1: B is reloaded
            await asyncio.sleep(0.05)
            assert upstream.held_servers() == frozenset() and fleet.loads == []
        await upstream.settled()
        assert upstream.held_servers() == {A, B} and fleet.loads == [(B, 1)]
        await upstream.serve_versions(set())  # the release ends: the trainer's sync has the servers again
        await upstream.settled()
        fleet.versions[B] = 4  # the trainer's sync moved B
        unrouted = await upstream.generate(request("s", None))
        assert upstream.held_servers() == frozenset() and unrouted.policy_version in (1, 4)
        await upstream.serve_versions({1, 2, 4})  # three versions, two servers: 2 cannot be served
        await upstream.settled()
        assert any("version(s) [2]" in e for e in upstream.errors) and upstream.resident_versions() == {1, 4}
        with pytest.raises(UpstreamError):
            await upstream.generate(request("s", 2))
        await upstream.close()

    asyncio.run(scenario())


def test_the_gateway_setting_composes_the_versioned_fleet_with_the_trainers_sync(tmp_path: Path) -> None:
    """``weight_sync.in_gateway`` + ``weight_sync.release_servers``: the gateway's upstream is the versioned fleet,
    loading through the weight sync, which follows the trainer and leaves the release's servers alone."""
    from tokentrail.runtime.vllm_versions import SyncLoader
    from tokentrail.runtime.weight_sync import gateway_upstream
    from tokentrail.settings import get_settings

    settings = get_settings()
    settings = settings.model_copy(update={
        "gateway": settings.gateway.model_copy(update={"upstream": f"{A},{B}"}),
        "weight_sync": settings.weight_sync.model_copy(update={"in_gateway": True, "release_servers": True}),
        "trainer": settings.trainer.model_copy(update={"checkpoint_dir": tmp_path / "policies"})})
    upstream = gateway_upstream(settings)
    assert isinstance(upstream, VersionedVLLMUpstream) and isinstance(upstream.loader, SyncLoader)
    sync = upstream.loader.sync
    assert upstream.trainer_sync is sync and upstream.follow_trainer and sync.store.root == tmp_path / "policies"
    upstream._moving[B] = 2  # the release took B for a version (what serve_versions does first)
    assert set(sync._held()) == {B}
    asyncio.run(upstream.close())
