"""The shell's composition of several policy versions on vLLM (settings ``weight_sync.release_servers``).

The gateway's versioned vLLM upstream (producers/upstreams/vllm_versions.py) loads a release's versions into
servers of their own through the weight sync's admin path (trainer_consumer/weight_sync, ``WeightSync.load_one``:
pause, reload from the policy store, reset the prefix cache, label, resume). The same ``WeightSync`` is the
trainer's fleet sync, told which servers the release holds so it updates only the others. The gateway may not
import the trainer's package, so the two meet here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.policy_store import PolicyStore
from producers.gateway.wiring import make_upstream
from producers.upstreams.vllm_versions import VersionedVLLMUpstream
from trainer_consumer.weight_sync import ServerStatus, WeightSync

if TYPE_CHECKING:
    from tokentrail.settings import Settings


class SyncLoader:
    """``WeightSync``'s single-server load as the upstream's ``VersionLoader``."""

    def __init__(self, sync: WeightSync) -> None:
        self.sync = sync

    async def load(self, server: str, version: int) -> None:
        state = await self.sync.load_one(server, version)
        if state.status in (ServerStatus.FAILED, ServerStatus.UNREACHABLE):
            raise RuntimeError(state.error or f"{server}: {state.status.value}")

    async def version_of(self, server: str) -> int | None:
        return await self.sync.version_of(server)

    def exclusive(self) -> asyncio.Lock:
        return self.sync.exclusive()


def release_servers_upstream(settings: Settings, *, store: PolicyStore | None = None, base_dir: Path | None = None,
                             follow_trainer: bool | None = None, **sync_options: Any) -> VersionedVLLMUpstream:
    """The settings' vLLM fleet serving a version per server for the release; with ``follow_trainer`` (default:
    ``weight_sync.in_gateway``) the gateway also runs the trainer's sync of the servers the release does not hold."""
    section = settings.weight_sync
    servers = [s for s in (section.servers or settings.gateway.upstream).split(",") if s.strip()]
    holder: list[VersionedVLLMUpstream] = []

    def held() -> Collection[str]:
        return holder[0].held_servers() if holder else ()

    # "wait", whatever weight_sync.pause_mode says: a call routed for a version must be sampled by that version,
    # so no update may land in a running call here (an in-flight update would move it to the next version)
    # (the transfer is the settings', as for every sync: a release's loads and the trainer's updates of the others)
    options: dict[str, Any] = {"pause_mode": "wait", "log": logging.getLogger("tokentrail.weight_sync").info,
                               **section.sync_options(), **sync_options}
    sync = WeightSync(servers, store or PolicyStore(settings.trainer.checkpoint_dir),
                      base_dir=base_dir or settings.model.dir, held=held, **options)
    upstream: VersionedVLLMUpstream = make_upstream(settings, version_loader=SyncLoader(sync))
    upstream.trainer_sync = sync
    upstream.follow_trainer = section.in_gateway if follow_trainer is None else follow_trainer
    holder.append(upstream)
    return upstream
