"""One attempt's state in the gateway's registry (``producers/gateway/attempts.py``): its counters and calls in
flight, the recent prompts and sampled outputs that later calls splice or delta against, and the bytes they keep,
counted against the registry's budget (``MemoryLedger``)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from producers.gateway.errors import conflict
from schemas.tokens import IDS_DTYPE, IdArray

RECENT_CALLS = 2  # prompts kept per attempt (the rest of the history is referenced by call id)
# Rough fixed costs of the bookkeeping around the arrays (objects, dict slots, id strings), so that a
# budget also bounds millions of tiny attempts.
STATE_OVERHEAD_BYTES = 1024
ENTRY_OVERHEAD_BYTES = 256  # one kept call or output


class MemoryLedger:
    """Bytes kept by the registry against its budget; ``on_over`` runs when an addition passes it."""

    def __init__(self, limit: int, on_over: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.used = 0
        self.on_over = on_over

    def add(self, nbytes: int) -> None:
        self.used += nbytes
        if nbytes > 0 and self.used > self.limit and self.on_over is not None:
            self.on_over()


@dataclass(frozen=True)
class SampledOutput:
    """One earlier call's exact sampled ids and what the harness was told they say (for splicing)."""

    call_id: str
    call_index: int
    output_ids: IdArray
    # The assistant message in the internal (OpenAI-style) chat form; None (rebuilt from Kafka): the
    # renderer parses it from the output ids, as the gateway did when it answered.
    message: dict[str, Any] | None

    @property
    def nbytes(self) -> int:
        size = len(orjson.dumps(self.message)) if self.message else 0
        return int(self.output_ids.nbytes) + size + ENTRY_OVERHEAD_BYTES


@dataclass(frozen=True)
class DeliveredCall:
    call_id: str
    call_index: int
    prompt_ids: IdArray
    output_ids: IdArray
    prompt_text: str | None = None  # what the prompt ids stand for, when the text side proved it

    @property
    def sequence(self) -> IdArray:
        return np.concatenate([self.prompt_ids, self.output_ids]).astype(IDS_DTYPE, copy=False)

    @property
    def nbytes(self) -> int:
        text = len(self.prompt_text) if self.prompt_text else 0
        return int(self.prompt_ids.nbytes + self.output_ids.nbytes) + text + ENTRY_OVERHEAD_BYTES


@dataclass(frozen=True)
class PriorSample:
    """What the renderer may splice: an earlier output, with its prompt when it is still kept."""

    call_index: int
    prompt_ids: IdArray | None
    output_ids: IdArray
    message: dict[str, Any] | None
    prompt_text: str | None = None


@dataclass
class AttemptState:
    rollout_id: str
    attempt_id: str
    attempt_number: int = 1
    api_key: str = ""
    started: bool = True  # False for the pseudo-attempts that hold unattributed calls
    next_call_index: int = 0
    next_event_index: int = 0
    finished: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    # The last delivered calls with their prompts, newest last: delta bases and splice prefixes.
    recent: deque[DeliveredCall] = field(default_factory=deque)
    # Every successful call's output (newest ``max_outputs``), for splicing into later prompts.
    outputs: OrderedDict[int, SampledOutput] = field(default_factory=OrderedDict)
    max_outputs: int = 4096
    in_flight: int = 0
    # Scripted completions still to emit, one per call (POST /v1/rollouts ``script``; tests only).
    script: deque[str | list[int]] = field(default_factory=deque)
    # Whose content the attempt's records carry (POST /v1/rollouts ``subject``, an organic session's key);
    # None: nobody's (synthetic traffic). Every record of the attempt names it (docs/forgetting.md).
    subject: str | None = None
    # Where the bytes kept here are counted (the registry's budget); None: not counted.
    ledger: MemoryLedger | None = None
    retained_bytes: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    @property
    def key(self) -> tuple[str, str]:
        return (self.rollout_id, self.attempt_id)

    def check_open(self, what: str = "calls") -> None:
        """Refuse (409) what arrives after the finish: finished while a request's body was still arriving, an
        index taken now would be past the counts the AttemptFinished states (call_count, event_count)."""
        if self.finished:
            raise conflict(f"attempt {self.attempt_id} of rollout {self.rollout_id} was finished while "
                           f"this request arrived; no more {what} are accepted", code="attempt_finished")

    def begin_call(self) -> int:
        self.check_open("calls")
        index = self.next_call_index
        self.next_call_index += 1
        self.in_flight += 1
        self._idle.clear()
        self.last_seen = time.monotonic()
        return index

    def end_call(self) -> None:
        self.in_flight -= 1
        self.last_seen = time.monotonic()
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait for in-flight calls to finish delivering; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def remember(self, delivered: DeliveredCall, output: SampledOutput | None) -> None:
        """A call was delivered: keep it as a delta base and its output for splicing."""
        self.keep_prompt(delivered)
        if output is not None:
            self.keep_output(output)

    def keep_prompt(self, delivered: DeliveredCall) -> None:
        grown = delivered.nbytes
        self.recent.append(delivered)
        while len(self.recent) > RECENT_CALLS:
            grown -= self.recent.popleft().nbytes
        self.account(grown)

    def keep_output(self, output: SampledOutput) -> None:
        replaced = self.outputs.pop(output.call_index, None)
        grown = output.nbytes - (replaced.nbytes if replaced else 0)
        self.outputs[output.call_index] = output
        while len(self.outputs) > self.max_outputs:
            grown -= self.outputs.popitem(last=False)[1].nbytes
        self.account(grown)

    def drop_prompts(self) -> int:
        """Forget the kept prompts (memory pressure); later calls delta-encode and splice without them."""
        freed = sum(c.nbytes for c in self.recent)
        self.recent.clear()
        self.account(-freed)
        return freed

    def drop_outputs(self) -> int:
        """Forget the kept outputs (memory pressure); later prompts are rendered from their text."""
        freed = sum(o.nbytes for o in self.outputs.values())
        self.outputs.clear()
        self.account(-freed)
        return freed

    def release(self) -> int:
        """Everything this state keeps, given back (it is finished or dropped)."""
        self.recent.clear()
        self.outputs.clear()
        freed = self.retained_bytes
        self.account(-freed)
        return freed

    def account(self, delta: int) -> None:
        self.retained_bytes += delta
        if self.ledger is not None and delta:
            self.ledger.add(delta)

    def prior_calls(self) -> list[PriorSample]:
        recent = {c.call_index: c for c in self.recent}
        out = []
        for o in self.outputs.values():
            kept = recent.get(o.call_index)
            out.append(PriorSample(o.call_index, kept.prompt_ids if kept else None, o.output_ids, o.message,
                                   kept.prompt_text if kept else None))
        return out

    def best_base(self, prompt_ids: IdArray) -> tuple[str | None, IdArray | None]:
        """The kept call whose prompt ‖ output shares the longest prefix with ``prompt_ids``."""
        best: tuple[str | None, IdArray | None] = (None, None)
        best_len = -1
        for call in reversed(self.recent):
            n = min(len(call.prompt_ids) + len(call.output_ids), len(prompt_ids))
            if n <= best_len:  # cannot share more than the best so far: not worth joining its ids
                continue
            seq = call.sequence
            diff = np.flatnonzero(seq[:n] != prompt_ids[:n])
            shared = int(diff[0]) if diff.size else n
            if shared > best_len:
                best, best_len = (call.call_id, seq), shared
        return best
