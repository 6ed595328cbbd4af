"""The shell's in-process composition of the weight sync with the gateway's vLLM upstream (``gate_upstream``).

The gateway's calls take leases from a ``VersionGate`` that the sync closes around each update, so every call
records the version that sampled it and only current servers take calls. The gateway's package may not import
the trainer's (``trainer_consumer.weight_sync``), so the two meet here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.policy_store import PolicyStore
from producers.upstreams.vllm import VLLMUpstream
from producers.upstreams.weight_gate import GatedUpstream
from tokentrail.runtime.vllm_versions import release_servers_upstream
from trainer_consumer.weight_sync import FleetView, VersionGate, WeightSync

if TYPE_CHECKING:
    from tokentrail.settings import Settings


class GateHooks:
    """The sync's hooks for a gateway in this process: before an update that touches a server taking
    calls, close the gate (running calls finish, new ones wait); after it, route only to the servers
    at the new version and reopen the gate there (calls sent now are held by the paused servers and
    sampled by the new weights). With no current server the gate stays closed: calls wait rather
    than be served by an old policy.

    ``in_flight``: the servers pause with ``keep``, so running calls are not waited for (the gate only holds
    new ones); vLLM's spans then say which of their tokens each version sampled."""

    def __init__(self, gate: VersionGate, upstream: VLLMUpstream, in_flight: bool = False) -> None:
        self.gate = gate
        self.upstream = upstream
        self.all_servers = list(upstream.servers)
        self.in_flight = in_flight

    async def before_update(self, version: int, servers: Sequence[str]) -> None:
        if set(servers) & set(self.upstream.servers):
            await (self.gate.hold() if self.in_flight else self.gate.close())

    async def after_update(self, view: FleetView) -> None:
        routable = [s for s in self.all_servers if s in set(view.routable())]
        if routable:
            self.upstream.servers = routable  # VLLMUpstream routes by this list (rendezvous order)
            self.upstream.set_policy_version(view.target)
            await self.gate.reopen(view.target)


def gate_upstream(upstream: VLLMUpstream, store: PolicyStore, *, base_dir: Path | None = None,
                  interval_s: float = 0.5, pause_mode: str = "wait", **sync_options: Any) -> GatedUpstream:
    """The gateway's upstream gated by a weight sync of the same servers (``.sync``), which the gateway
    runs when it is created with ``policy_dir`` = the store's root.

    ``pause_mode="keep"`` (in-flight updates) only where the upstream reads vLLM's per-token versions
    (``token_endpoint="generate"``): a call running across an update is then recorded with its spans.
    Without them a call's version is its lease, which is exact only if no call runs across an update,
    so the sync waits for running calls (``wait``) instead."""
    if pause_mode == "keep" and upstream.token_endpoint != "generate":
        logging.getLogger("tokentrail.weight_sync").warning(
            "weight sync: pause mode keep needs engine versions (token_endpoint generate); using wait")
        pause_mode = "wait"
    in_flight = pause_mode == "keep"
    gate = VersionGate(0, is_open=False)  # until the first look at the fleet says what it serves
    sync = WeightSync(upstream.servers, store, hooks=GateHooks(gate, upstream, in_flight), base_dir=base_dir,
                      pause_mode=pause_mode, **sync_options)  # type: ignore[arg-type]
    return GatedUpstream(upstream, gate, sync, interval_s, in_flight_updates=in_flight)


def gateway_upstream(settings: Settings) -> Any:
    """``tokentrail gateway``'s vLLM upstream when ``weight_sync.in_gateway`` is on: the settings' vLLM
    fleet, gated by a weight sync that follows ``trainer.checkpoint_dir``; with ``weight_sync.release_servers``
    the fleet serves each version a release serves on servers of its own, and the sync keeps the others on
    the newest version (tokentrail/runtime/vllm_versions.py)."""
    section = settings.weight_sync
    if section.release_servers:
        return release_servers_upstream(settings, follow_trainer=True)
    upstream = VLLMUpstream.from_settings(settings.gateway,
                                          token_endpoint="generate" if section.engine_versions else "completions")
    return gate_upstream(upstream, PolicyStore(settings.trainer.checkpoint_dir), base_dir=settings.model.dir,
                         interval_s=section.interval_s, pause_mode=section.pause_mode,
                         log=logging.getLogger("tokentrail.weight_sync").info, **section.sync_options())
