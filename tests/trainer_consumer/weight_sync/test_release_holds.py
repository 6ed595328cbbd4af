"""The split between the trainer's fleet sync and a release that serves several versions, one per server: the
sync never touches a server the release holds, the release loads its servers through the sync's admin path
(``load_one``) without moving the fleet's target, and a server the release lets go is brought to the
trainer's newest version at the next tick. Stand-in servers and the real policy store, as in
test_syncer_fleet.py; the live test is tests/producers/upstreams/vllm_live/test_release_servers_live.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import torch

from models.policy_store import PolicyStore
from trainer_consumer.weight_sync import ServerStatus, WeightSync

from .test_syncer_fleet import StandInServer


def test_the_sync_updates_only_the_servers_a_release_does_not_hold(tmp_path: Path) -> None:
    servers = {"http://a": StandInServer(), "http://b": StandInServer(), "http://c": StandInServer()}
    transport = httpx.MockTransport(lambda r: servers[f"{r.url.scheme}://{r.url.host}"].answer(r))
    store = PolicyStore(tmp_path / "policies")
    for version in (1, 2):
        store.publish(version, {"w": torch.full((2,), float(version))})
    held: set[str] = set()

    async def scenario() -> None:
        sync = WeightSync(list(servers), store, base_dir=tmp_path / "base", held=lambda: held,
                          client=httpx.AsyncClient(transport=transport))
        try:
            # The release holds a (serving v1) and b (candidate v2), loaded through the sync's admin path.
            held.update({"http://a", "http://b"})
            assert (await sync.load_one("http://a", 1)).version == 1
            state = await sync.load_one("http://b", 2)
            assert (state.version, sync.view.target) == (2, 0)  # the fleet's target did not move
            assert await sync.version_of("http://b") == 2 and servers["http://b"].loaded == str(store.path(2))
            assert not any(s.paused for s in servers.values())

            store.publish(3, {"w": torch.full((2,), 3.0)})  # the trainer goes on
            report = await sync.tick()
            assert report is not None and report.version == 3 and report.updated == ["http://c"]
            assert [s.label for s in servers.values()] == ["1", "2", "3"]  # the held ones kept their versions
            assert await sync.tick() is None  # held servers behind the target are not "lagging"
            assert [s.label for s in servers.values()] == ["1", "2", "3"]

            held.discard("http://b")  # the release lets b go (a rollback moved its sessions away)
            report = await sync.tick()
            assert report is not None and report.updated == ["http://b"] and servers["http://b"].label == "3"
            assert sync.view.servers["http://b"].status is ServerStatus.CURRENT

            servers["http://a"].fail_reload = True  # a failed release load is reported, never labelled v2
            state = await sync.load_one("http://a", 2)
            assert state.status is ServerStatus.FAILED and servers["http://a"].label == "incomplete-2"
        finally:
            await sync.close()

    asyncio.run(scenario())
