"""The gateway's vLLM upstream behind a version gate (``GatedUpstream``): token generations hold a lease of the
gate from their first item to their end, and each call records the version that sampled it.

The gate and the sync that closes it around each weight update are the trainer side's
(``trainer_consumer.weight_sync``: ``VersionGate``, ``WeightSync``); this component may not import that package,
so it takes them by the small interfaces below, and the shell composes the two
(``tokentrail.runtime.weight_sync.gate_upstream``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from models.policy_store import PolicyStore
from producers.upstreams.base import ChatGenerateRequest, GenerateRequest, GenerateResult, TokenChunk
from producers.upstreams.deferred_stream import DeferredStream
from producers.upstreams.vllm import VLLMUpstream, label_version, spans_from_text

_log = logging.getLogger("tokentrail.weight_sync")


class Gate(Protocol):
    """What a call needs of the version gate (``trainer_consumer.weight_sync.VersionGate``)."""

    version: int

    def lease(self) -> contextlib.AbstractAsyncContextManager[int]: ...


class Sync(Protocol):
    """What the gated upstream runs and stops of the weight sync (``trainer_consumer.weight_sync.WeightSync``)."""

    store: PolicyStore

    async def follow(self, stop: asyncio.Event, interval_s: float) -> None: ...

    async def close(self) -> None: ...


class GatedUpstream:
    """``VLLMUpstream`` whose token generations hold a lease of ``gate`` from their first item to their
    end; the result's ``policy_version`` is the leased one. (Chat pass-through is not gated.)

    When vLLM reports which weights sampled the tokens (``token_endpoint="generate"``: per-token
    ``weight_versions`` spans), that report is the call's version and the lease is the check: the
    leased version goes into the result's ``extra["gate_version"]`` beside the spans, and a call where
    the two disagree is counted in ``checks["mismatched"]`` and logged. Under the gate they cannot
    disagree (no call runs while weights change); the count says so on real traffic.

    With ``sync``, the gateway's ``policy_dir`` start-up hook (``follow_policies``) runs the sync on the
    gateway's event loop, where the gate lives; ``close`` stops it."""

    def __init__(self, inner: VLLMUpstream, gate: Gate, sync: Sync | None = None,
                 interval_s: float = 0.5) -> None:
        self.inner = inner
        self.gate = gate
        self.sync = sync
        self.interval_s = interval_s
        self._stop: asyncio.Event | None = None
        self._follower: asyncio.Task[None] | None = None
        # calls whose version vLLM reported and that were compared with their lease; those that disagreed;
        # those whose tokens span more than one version (impossible under pause mode "wait")
        self.checks = {"checked": 0, "mismatched": 0, "spanning": 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def follow_policies(self, store: PolicyStore, interval_s: float | None = None) -> None:
        if self.sync is None or self._follower is not None:
            return
        if store.root != self.sync.store.root:
            raise ValueError(f"the weight sync follows {self.sync.store.root}, the gateway was given {store.root}")
        self._stop = asyncio.Event()
        self._follower = asyncio.get_running_loop().create_task(
            self.sync.follow(self._stop, interval_s or self.interval_s))

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        async with self.gate.lease() as version:
            result = await self.inner.generate(request)
        self.settle_version(result, version)
        return result

    def settle_version(self, result: GenerateResult, leased: int) -> None:
        """The version ``result`` records: vLLM's own report where it gave one (checked against the lease),
        else the leased one."""
        reported = result.extra.get("weight_versions")
        if not isinstance(reported, str):
            result.policy_version = leased
            return
        result.extra["gate_version"] = leased
        spans = spans_from_text(reported)
        self.checks["checked"] += 1
        if len({s.version for s in spans}) > 1:
            self.checks["spanning"] += 1
        if spans and label_version(spans[0].version) is None:  # a foreign label names no policy version
            result.policy_version = leased
        if any(label_version(s.version) != leased for s in spans):
            self.checks["mismatched"] += 1
            _log.warning("call %s: vLLM sampled it with weights %s, the gate leased version %d",
                         result.extra.get("vllm_id"), reported, leased)

    def generate_stream(self, request: GenerateRequest) -> _LeasedStream:
        return _LeasedStream(self.inner.generate_stream(request), self.gate, self)

    def generate_chat_stream(self, request: ChatGenerateRequest) -> _LeasedStream:
        return _LeasedStream(self.inner.generate_chat_stream(request), self.gate, self)

    async def policy_version(self) -> int:
        return self.gate.version

    async def close(self) -> None:
        if self._follower is not None and self._stop is not None:
            self._stop.set()
            await self._follower
            self._follower = None
        if self.sync is not None:
            await self.sync.close()
        await self.inner.close()


class _LeasedStream(DeferredStream):
    """The inner stream, under a lease of the gate taken at its first item (it may wait while an update runs)
    and held to its end; the final result records the leased version (``GatedUpstream.settle_version``)."""

    def __init__(self, inner: Any, gate: Gate, owner: GatedUpstream) -> None:
        super().__init__(inner)
        self._gate = gate
        self._owner = owner
        self._lease: contextlib.AbstractAsyncContextManager[int] | None = None
        self._version = gate.version

    async def _open(self) -> None:
        lease = self._gate.lease()
        self._version = await lease.__aenter__()  # may wait while an update runs
        self._lease = lease  # only a lease actually taken is released

    async def _settle(self, item: TokenChunk | GenerateResult) -> TokenChunk | GenerateResult:
        if isinstance(item, GenerateResult):
            self._owner.settle_version(item, self._version)
        return item

    async def _release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.__aexit__(None, None, None)
