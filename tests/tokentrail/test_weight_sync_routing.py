"""The shell's composition of the weight sync with the gateway's vLLM upstream (``gate_upstream``): calls are
routed only to servers at the gate's version. A killed server leaves routing; restarted (on the base weights)
it takes no call until the sync has brought it to the current version.

The real ``VLLMUpstream`` (its routing: which server each rollout's call goes to, failover order included) and
the real sync and gate; the vLLM servers are the stand-ins of the sync's own tests, answering the admin
endpoints in process. The live test is tests/producers/upstreams/vllm_live/test_server_kill_live.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import torch

from models.policy_store import PolicyStore
from producers.upstreams.vllm import VLLMUpstream
from tests.trainer_consumer.weight_sync.test_syncer_fleet import StandInServer
from tokentrail.runtime.weight_sync import gate_upstream

ROLLOUTS = [f"rollout-{i}" for i in range(64)]  # enough that every server is some rollout's first choice


def test_a_restarted_server_is_routed_no_call_until_it_is_at_the_gates_version(tmp_path: Path) -> None:
    servers = {"http://a": StandInServer(), "http://b": StandInServer()}
    transport = httpx.MockTransport(lambda r: servers[f"{r.url.scheme}://{r.url.host}"].answer(r))
    store = PolicyStore(tmp_path / "policies")
    inner = VLLMUpstream(list(servers), model="tiny")
    upstream = gate_upstream(inner, store, base_dir=tmp_path / "base",
                             client=httpx.AsyncClient(transport=transport))
    assert upstream.sync is not None

    def routed() -> set[str]:
        """Every server some rollout's call could reach (its first choice or a failover)."""
        return {server for rollout in ROLLOUTS for server in inner.servers_for(rollout)}

    def at_gate_version() -> set[str]:
        return {url for url, s in servers.items() if s.up and s.label == str(upstream.gate.version)}

    async def scenario() -> None:
        try:
            await upstream.sync.tick()  # both on the base weights: version 0, both routed
            assert (upstream.gate.version, routed()) == (0, {"http://a", "http://b"})

            store.publish(1, {"w": torch.ones(2)})
            await upstream.sync.tick()
            assert (upstream.gate.version, routed()) == (1, {"http://a", "http://b"}) and routed() == at_gate_version()

            servers["http://b"].up = False  # killed: out of every rollout's order at the next tick
            await upstream.sync.tick()
            assert routed() == {"http://a"}

            store.publish(2, {"w": torch.full((2,), 2.0)})  # lands while b is down
            await upstream.sync.tick()
            assert (upstream.gate.version, routed()) == (2, {"http://a"})

            servers["http://b"].restart()  # listening again, on the base weights ("default"): no call yet
            assert routed() == {"http://a"} and servers["http://b"].label == "default"

            report = await upstream.sync.tick()  # the sync finds it at version 0 and brings it to 2, alone
            assert report is not None and (report.previous["http://b"], report.updated) == (0, ["http://b"])
            assert servers["http://b"].label == "2" and routed() == {"http://a", "http://b"} == at_gate_version()
        finally:
            await upstream.close()

    asyncio.run(scenario())


def test_narrowing_the_upstreams_servers_narrows_every_rollouts_route() -> None:
    inner = VLLMUpstream(["http://a", "http://b/"])
    assert {inner.servers_for(r)[0] for r in ROLLOUTS} == {"http://a", "http://b"}
    inner.servers = ["http://a"]
    assert all(inner.servers_for(r) == ["http://a"] for r in ROLLOUTS)
    try:
        inner.servers = []
    except ValueError as exc:
        assert "at least one server" in str(exc)
    else:
        raise AssertionError("an empty routing list was accepted")
    assert inner.servers == ["http://a"]
