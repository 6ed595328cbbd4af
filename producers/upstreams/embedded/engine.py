"""The embedded reference engine: the local transformers model on the CPU behind the ``Upstream`` protocol.

Token ids in, sampled ids and their logprobs out. Generation runs on one worker thread, off the event
loop; requests that arrive together are decoded as one batch (left-padded prefill, shared KV cache
steps). Each request has its own seeded generator, so its samples do not depend on its batch mates.
New policy weights are swapped in between batches, so every result comes from exactly one version.

Several versions serve at once (a release: docs/release.md): a request may name its version
(``GenerateRequest.policy_version``); a batch is decoded in one group per version, the model switched to
each group's weights first. The weights of up to ``max_resident_versions`` versions stay in memory
(``versions.py``, LRU, never evicting one the release serves or the default); others are loaded from the
policy store on first use. Requests that name no version get the default: the newest version followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from models.policy_store import PolicyStore, load_weights_dir
from producers.rendering import ChatRenderer
from producers.upstreams.base import (
    ChatGenerateRequest,
    GenerateRequest,
    GenerateResult,
    LogprobKind,
    Sampling,
    TokenChunk,
    UpstreamError,
)
from producers.upstreams.embedded.decode import DecodeRow, decode_batch
from producers.upstreams.embedded.sampling import RowParams
from producers.upstreams.embedded.versions import ResidentVersions, StateDict
from schemas.tokens import IDS_DTYPE, TokenIds

ENGINE_VERSION = "0.1"


@dataclass
class _Job:
    request: GenerateRequest
    seed: int
    stream: bool
    deliver: Callable[[object], None]  # thread-safe hand-off to the caller's event loop
    enqueued_at: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Swap:
    """Make ``state`` the default version (and resident)."""

    version: int
    state: StateDict
    done: Callable[[BaseException | None], None]


@dataclass
class _Serve:
    """The versions a release serves now: kept resident (loaded from the store if missing)."""

    versions: frozenset[int]
    done: Callable[[BaseException | None], None]


_Control = _Swap | _Serve


class EmbeddedEngine:
    """``Upstream`` implementation over a local causal LM directory (see ``models.reference.build``)."""

    supports_forced_output = True  # GenerateRequest.forced_ids: scripted outputs for tests

    def __init__(self, model_dir: Path, *, name: str = "embedded", logprob_kind: LogprobKind = "PROCESSED",
                 threads: int | None = 1, max_batch: int = 16, batch_window_ms: float = 2.0,
                 policy_version: int = 0, max_resident_versions: int = 4) -> None:
        from transformers import AutoModelForCausalLM

        if logprob_kind not in ("RAW", "PROCESSED"):
            raise ValueError(f"logprob_kind must be RAW or PROCESSED, not {logprob_kind!r}")
        if threads:
            torch.set_num_threads(threads)  # process-wide; tiny matrices gain nothing from more
        self.name = name
        self.model_dir = Path(model_dir)
        self.logprob_kind: LogprobKind = logprob_kind
        self.max_batch = max(1, max_batch)
        self._window_s = max(0.0, batch_window_ms) / 1000.0
        self._model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        config = self._model.config
        self.vocab_size = int(config.vocab_size)
        self.max_model_len = int(config.max_position_embeddings)
        eos = config.eos_token_id
        self.eos_token_ids = frozenset(eos if isinstance(eos, list) else [eos])
        pad = config.pad_token_id
        self._pad_id = int(pad if pad is not None else min(self.eos_token_ids))
        self._version = policy_version  # the default: serves requests that name no version
        # Worker-thread state: resident weights, the version the model holds now, the release's versions.
        self._resident = ResidentVersions(max_resident_versions)
        self._resident.put(policy_version, {k: v.detach().clone() for k, v in self._model.state_dict().items()})
        self._loaded = policy_version
        self._served: frozenset[int] = frozenset()
        self._store: PolicyStore | None = None  # where versions that are not resident are loaded from
        self._jobs: queue.Queue[_Job | _Control | None] = queue.Queue()
        self._follower: asyncio.Task[None] | None = None
        self._renderer: ChatRenderer | None = None  # pass-through only: loaded on first use
        self._closed = False
        self._worker = threading.Thread(target=self._run, name=f"{name}-engine", daemon=True)
        self._worker.start()

    @property
    def engine(self) -> str:
        return f"embedded/{ENGINE_VERSION}"

    # ------------------------------------------------------------------------------ Upstream API
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        async with contextlib.aclosing(self._submit(request, stream=False)) as items:
            async for item in items:
                if isinstance(item, GenerateResult):
                    return item
        raise UpstreamError("the engine ended the request without a result", 500, "engine_error")

    def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        return self._submit(request, stream=True)

    async def generate_chat_stream(self, request: ChatGenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        """Pass-through, as a vLLM server does it: the model directory's own chat template renders the
        conversation (``apply_chat_template``); the prompt ids go out with the first chunk and the result."""
        renderer = self._chat_renderer()
        try:
            prompt = renderer.render(request.messages, request.tools, template_kwargs=request.template_kwargs or None)
        except ValueError as exc:  # the template refuses the conversation: the caller's error
            raise UpstreamError(str(exc), 400, "invalid_request_error") from None
        ids = np.asarray(prompt, dtype=IDS_DTYPE)
        inner = GenerateRequest(prompt_ids=ids, sampling=request.sampling, request_id=request.request_id,
                                rollout_id=request.rollout_id, policy_version=request.policy_version)
        announced = False
        async with contextlib.aclosing(self._submit(inner, stream=True)) as items:
            async for item in items:
                if isinstance(item, TokenChunk) and not announced:
                    item.prompt_ids, announced = ids, True
                elif isinstance(item, GenerateResult):
                    item.chat_template_fingerprint = renderer.chat_template_fingerprint
                yield item

    def _chat_renderer(self) -> ChatRenderer:
        if self._renderer is None:
            self._renderer = ChatRenderer(self.model_dir, cache_tokens=0)
        return self._renderer

    async def policy_version(self) -> int:
        return self._version

    def resident_versions(self) -> list[int]:
        """The versions whose weights are in memory, least recently used first (a snapshot)."""
        return self._resident.versions()

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
            await asyncio.to_thread(self._worker.join)

    # ------------------------------------------------------------------------------ policies
    async def load_policy(self, version: int, weights_dir: Path) -> None:
        """Swap in the weights in ``weights_dir`` (a policy store version directory or a file) as
        ``version``; requests already decoding finish on the old weights."""
        await self._swap_in(version, await asyncio.to_thread(load_weights_dir, weights_dir))

    async def _swap_in(self, version: int, state: dict[str, torch.Tensor]) -> None:
        await self._control(lambda done: _Swap(version, state, done))

    async def serve_versions(self, versions: set[int] | frozenset[int], store: PolicyStore | None = None) -> None:
        """Keep ``versions`` (those a release serves now) resident, loading missing ones from ``store`` (or
        the store already in use); they are never evicted until a later call drops them. Raises when one
        cannot be loaded; the others are kept."""
        if store is not None:
            self._store = store
        await self._control(lambda done: _Serve(frozenset(versions), done))

    def use_store(self, store: PolicyStore) -> None:
        """Load versions that are not resident from ``store`` when a request names them."""
        self._store = store

    async def _control(self, make: Callable[[Callable[[BaseException | None], None]], _Control]) -> None:
        """Hand a control item to the worker (between batches) and wait until it is applied."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def done(error: BaseException | None) -> None:
            def settle() -> None:
                if not finished.done():
                    finished.set_exception(error) if error else finished.set_result(None)

            loop.call_soon_threadsafe(settle)

        self._ensure_open()
        self._jobs.put(make(done))
        await finished

    async def refresh_policy(self, store: PolicyStore) -> bool:
        """Load the store's latest version if it is newer than the one serving; True if it loaded."""
        latest = await asyncio.to_thread(store.latest_version)
        if latest is None or latest <= self._version:
            return False
        await self._swap_in(latest, await asyncio.to_thread(store.load_state_dict, latest))  # sha-checked
        return True

    def follow_policies(self, store: PolicyStore, interval_s: float = 1.0) -> None:
        """Poll the store in the background and load each newer version as it is published."""

        async def follow() -> None:
            while True:
                with contextlib.suppress(Exception):  # a half-written store is retried next tick
                    await self.refresh_policy(store)
                await asyncio.sleep(interval_s)

        self._store = store
        if self._follower is None:
            self._follower = asyncio.get_running_loop().create_task(follow())

    # ------------------------------------------------------------------------------ internals
    async def _submit(self, request: GenerateRequest,
                      stream: bool) -> AsyncIterator[TokenChunk | GenerateResult]:
        self._validate(request)
        self._ensure_open()
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[object] = asyncio.Queue()

        def deliver(item: object) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop is gone; nobody is listening
                loop.call_soon_threadsafe(inbox.put_nowait, item)

        seed = request.sampling.seed if request.sampling.seed is not None else secrets.randbits(63)
        job = _Job(request, seed, stream, deliver)
        self._jobs.put(job)
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, TokenChunk | GenerateResult)
                yield item
                if isinstance(item, GenerateResult):
                    return
        finally:
            job.cancelled.set()  # no-op once finished; stops decoding if the caller went away

    def _ensure_open(self) -> None:
        if self._closed:
            raise UpstreamError("the embedded engine is closed", 503, "engine_closed")

    def _validate(self, request: GenerateRequest) -> None:
        sampling: Sampling = request.sampling
        ids = request.prompt_ids
        if not len(ids):
            raise UpstreamError("the prompt is empty", 400, "invalid_request_error")
        bad = _first_out_of_vocabulary(ids, self.vocab_size)
        if bad is not None:
            raise UpstreamError(f"Token id {bad} is out of vocabulary", 400, "invalid_request_error")
        if sampling.max_tokens < 1:
            raise UpstreamError("max_tokens must be at least 1", 400, "invalid_request_error")
        if len(ids) + sampling.max_tokens > self.max_model_len:
            raise UpstreamError(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{len(ids)} and max_tokens is {sampling.max_tokens}", 400, "invalid_request_error")
        if request.forced_ids is not None:
            bad = _first_out_of_vocabulary(list(request.forced_ids), self.vocab_size)
            if not request.forced_ids or bad is not None:
                raise UpstreamError(f"the scripted output is empty or holds an id outside the vocabulary ({bad})",
                                    400, "invalid_request_error")
        if sampling.temperature < 0 or not 0 < sampling.top_p <= 1 or sampling.top_k < 0:
            raise UpstreamError("temperature must be >= 0, top_p in (0, 1], top_k >= 0", 400,
                                "invalid_request_error")

    def _run(self) -> None:
        """Worker thread: gather a batch, decode it, apply swaps between batches."""
        while True:
            item = self._jobs.get()
            if item is None:
                return
            if isinstance(item, _Swap | _Serve):
                self._apply(item)
                continue
            batch = [item]
            deferred: _Control | None = None
            stop = False
            deadline = time.perf_counter() + self._window_s
            while len(batch) < self.max_batch:
                try:
                    more = self._jobs.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                if isinstance(more, _Swap | _Serve):
                    deferred = more
                    break
                batch.append(more)
            self._decode([job for job in batch if not job.cancelled.is_set()])
            if deferred is not None:
                self._apply(deferred)
            if stop:
                return

    def _apply(self, item: _Control) -> None:
        if isinstance(item, _Serve):
            self._served = item.versions
            self._resident.protect(self._served | {self._version})
            failures = []
            for version in sorted(item.versions):
                try:
                    self._weights(version)
                except UpstreamError as exc:
                    failures.append(str(exc))
            item.done(UpstreamError("; ".join(failures), 503, "policy_version_unavailable") if failures else None)
            return
        try:
            self._model.load_state_dict(item.state, strict=True)
        except Exception as exc:
            self._loaded = -1  # the model may hold part of the refused weights: reload before the next decode
            item.done(ValueError(f"policy {item.version} does not fit the model: {exc}"))
            return
        self._loaded = self._version = item.version
        self._resident.protect(self._served | {self._version})
        self._resident.put(item.version, item.state)
        item.done(None)

    def _weights(self, version: int) -> StateDict:
        """The resident weights of ``version``, loading them from the store (sha-checked) if needed."""
        state = self._resident.get(version)
        if state is not None:
            return state
        if self._store is None:
            raise UpstreamError(f"policy version {version} is not loaded and the engine has no policy store",
                                503, "policy_version_unavailable")
        try:
            state = self._store.load_state_dict(version)
        except Exception as exc:
            raise UpstreamError(f"policy version {version} cannot be loaded: {exc}", 503,
                                "policy_version_unavailable") from None
        self._resident.put(version, state)
        return state

    def _decode(self, jobs: list[_Job]) -> None:
        """Decode ``jobs`` in one group per policy version, switching the model's weights between groups."""
        groups: dict[int, list[_Job]] = {}
        for job in jobs:
            wanted = job.request.policy_version
            groups.setdefault(self._version if wanted is None else wanted, []).append(job)
        # The version the model holds first, so a batch of one version never switches.
        for version in sorted(groups, key=lambda v: v != self._loaded):
            group = groups[version]
            try:
                if version != self._loaded:
                    self._model.load_state_dict(self._weights(version), strict=True)
                    self._loaded = version
            except UpstreamError as exc:
                for job in group:
                    job.deliver(exc)
                continue
            self._decode_version(group, version)

    def _decode_version(self, jobs: list[_Job], version: int) -> None:
        if not jobs:
            return
        started = time.perf_counter()
        rows = [self._row(job) for job in jobs]
        try:
            decode_batch(self._model, rows, self._pad_id, self.logprob_kind, self.max_model_len)
        except Exception as exc:  # a bug or resource failure: every caller gets an error, none hangs
            for job in jobs:
                job.deliver(UpstreamError(f"embedded engine failed: {exc}", 500, "engine_error"))
            return
        finished = time.perf_counter()
        for job, row in zip(jobs, rows, strict=True):
            if row.finish_reason == "cancelled":
                continue
            job.deliver(GenerateResult(
                prompt_ids=job.request.prompt_ids,
                output_ids=row.output_ids,
                output_logprobs=row.output_logprobs,
                finish_reason=row.finish_reason,
                # Scripted tokens carry the model's RAW logprobs (see decode.py), whatever the engine's kind.
                logprob_kind="RAW" if job.request.forced_ids is not None else self.logprob_kind,
                policy_version=version,
                engine=self.engine,
                upstream=f"{self.name}:{self.model_dir.name}",
                queue_ms=(started - job.enqueued_at) * 1000.0,
                first_token_ms=(row.first_token_at - job.enqueued_at) * 1000.0,
                total_ms=(finished - job.enqueued_at) * 1000.0,
                extra={"seed": job.seed, "batch_size": len(jobs), "torch": torch.__version__,
                       **({"scripted": True} if job.request.forced_ids is not None else {})},
            ))

    def _row(self, job: _Job) -> DecodeRow:
        sampling = job.request.sampling

        def on_token(ids: list[int], logprobs: list[float]) -> bool:
            if job.cancelled.is_set():
                return False
            if job.stream:
                job.deliver(TokenChunk(ids, logprobs))
            return True

        return DecodeRow(
            prompt_ids=job.request.prompt_ids,
            params=RowParams.of(sampling),
            max_tokens=sampling.max_tokens,
            stop_ids=self.eos_token_ids | frozenset(sampling.stop_token_ids),
            seed=job.seed,
            on_token=on_token,
            forced=job.request.forced_ids,
        )


def _first_out_of_vocabulary(ids: TokenIds, vocab_size: int) -> object | None:
    """The first id that is not an integer in 0..vocab_size-1, or None. The gateway's uint32 arrays
    are checked in one vectorised pass; lists (from other callers) one by one."""
    if not isinstance(ids, np.ndarray):
        return next((i for i in ids if not isinstance(i, int) or not 0 <= i < vocab_size), None)
    if ids.dtype.kind not in "iu":
        return ids[0].item()
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    return int(ids[bad[0]]) if bad.size else None
