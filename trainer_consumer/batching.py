"""The pure half of the sample stream: filter decoded samples and cut them into batches.

No Kafka here. A filtered sample is never dropped silently: each filter returns a reason, the
reasons are counted, and the counts travel with the next batch into its TrainerStep.filtered_json.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import orjson

from trainer_consumer.sample_view import TrainSample, check_sample
from trainer_consumer.staleness import DEFAULT_MAX_STALENESS, StalenessBound, StaleRule

if TYPE_CHECKING:
    from trainer_consumer.settings import TrainerSettings

# A filter looks at one sample and the trainer's current policy version; it returns the reason to
# drop the sample, or None to keep it.
SampleFilter = Callable[[TrainSample, int], str | None]

STALE = "stale"
DUPLICATE = "duplicate"


def max_tokens_filter(max_tokens: int) -> SampleFilter:
    def too_long(sample: TrainSample, current_version: int) -> str | None:
        return "too_long" if sample.num_tokens > max_tokens else None

    return too_long


def zero_weight_filter() -> SampleFilter:
    """Samples whose loss tokens carry no weight add nothing to the gradient, only cost."""

    def zero_weight(sample: TrainSample, current_version: int) -> str | None:
        carrying = np.count_nonzero((sample.weights > 0) & (sample.loss_mask != 0))
        return "zero_weight" if carrying == 0 else None

    return zero_weight


def zero_advantage_filter() -> SampleFilter:
    """E.g. GRPO groups where every rollout scored the same: every advantage is zero."""

    def zero_advantage(sample: TrainSample, current_version: int) -> str | None:
        moving = np.count_nonzero((sample.advantages != 0) & (sample.loss_mask != 0))
        return "zero_advantage" if moving == 0 else None

    return zero_advantage


def vocab_filter(vocab_size: int) -> SampleFilter:
    """Token ids the model has no embedding for would crash the step; they mean a sample from
    another tokenizer, so the sample is refused instead."""

    def out_of_vocab(sample: TrainSample, current_version: int) -> str | None:
        return "token_id_out_of_vocab" if int(sample.input_ids.max()) >= vocab_size else None

    return out_of_vocab


def kind_filter(allowed: Sequence[str]) -> SampleFilter:
    allowed_set = frozenset(allowed)

    def kind(sample: TrainSample, current_version: int) -> str | None:
        return f"kind:{sample.kind}" if sample.kind not in allowed_set else None

    return kind


@dataclass(frozen=True)
class FilterConfig:
    max_staleness: int = DEFAULT_MAX_STALENESS  # the bound and its rule: trainer_consumer/staleness.py
    stale_rule: StaleRule = "drop"
    max_tokens: int | None = None
    drop_zero_weight: bool = True
    drop_zero_advantage: bool = False
    kinds: tuple[str, ...] | None = None  # None: every kind
    vocab_size: int | None = None  # the trainer sets it from the model's embedding table

    @classmethod
    def from_settings(cls, trainer: TrainerSettings, *, max_staleness: int | None = None,
                      stale_rule: StaleRule | None = None, **options: Any) -> FilterConfig:
        """The filters the ``trainer`` settings section configures: its staleness bound, where a command-line
        flag given (not None) wins, and the other ``options`` as given (the one place the two are merged)."""
        return cls(max_staleness=trainer.max_staleness if max_staleness is None else max_staleness,
                   stale_rule=stale_rule or trainer.stale_rule, **options)

    def staleness(self) -> StalenessBound:
        return StalenessBound(self.max_staleness, self.stale_rule)

    def build(self) -> list[SampleFilter]:
        """The filters besides staleness (``staleness()``, given to the ``BatchBuilder`` apart)."""
        filters: list[SampleFilter] = []
        if self.vocab_size is not None:
            filters.append(vocab_filter(self.vocab_size))
        if self.max_tokens is not None:
            filters.append(max_tokens_filter(self.max_tokens))
        if self.drop_zero_weight:
            filters.append(zero_weight_filter())
        if self.drop_zero_advantage:
            filters.append(zero_advantage_filter())
        if self.kinds is not None:
            filters.append(kind_filter(self.kinds))
        return filters


def filter_reason(sample: TrainSample, current_version: int, filters: Iterable[SampleFilter]) -> str | None:
    """The first reason to drop ``sample``: malformed arrays first, then the configured filters."""
    reason = check_sample(sample)
    if reason is not None:
        return reason
    for f in filters:
        reason = f(sample, current_version)
        if reason is not None:
            return reason
    return None


P = TypeVar("P")  # where an item came from (e.g. a Kafka (topic, partition, offset)); opaque here


@dataclass
class Batch(Generic[P]):
    samples: list[TrainSample]
    filtered: Counter[str]
    # Positions of every item this batch accounts for: kept, filtered and undecodable alike, so
    # committing them after the step covers everything consumed.
    positions: list[P] = field(default_factory=list)
    # Samples the staleness bound dropped (also counted in ``filtered`` as "stale"), by id, so the
    # TrainerStep names them: a dropped sample is accounted for, not lost.
    stale_dropped_ids: list[str] = field(default_factory=list)
    stale_masked_tokens: int = 0  # loss tokens of kept samples the "mask" rule took the weight off

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.samples)

    @property
    def sample_ids(self) -> list[str]:
        return [s.sample_id for s in self.samples]

    def filtered_json(self) -> str:
        return orjson.dumps(dict(sorted(self.filtered.items()))).decode()


class BatchBuilder(Generic[P]):
    """Accumulates samples (and rejects) until a batch is full by sample count or token budget."""

    def __init__(self, batch_size: int, max_batch_tokens: int | None = None,
                 filters: Sequence[SampleFilter] = (), dedupe_window: int = 100_000,
                 staleness: StalenessBound | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.filters = list(filters)
        self.staleness = staleness
        # (position, sample or None, reason or None, id of a stale-dropped sample or None) in arrival order.
        self._entries: list[tuple[P, TrainSample | None, str | None, str | None]] = []
        self._masked: dict[str, int] = {}  # kept sample id -> loss tokens the stale rule masked
        self._kept = 0
        self._kept_tokens = 0
        # Ids of samples already handed out in a batch (bounded, oldest forgotten first): a sample
        # delivered twice (producer retry, replay into the same topic) is trained once.
        self.dedupe_window = dedupe_window
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._pending_ids: set[str] = set()

    def add(self, sample: TrainSample, position: P, current_version: int) -> str | None:
        """Adds a sample, or records why it was filtered (returned)."""
        reason = filter_reason(sample, current_version, self.filters)
        if reason is None and (sample.sample_id in self._pending_ids or sample.sample_id in self._recent):
            reason = DUPLICATE
        masked = 0
        if reason is None and self.staleness is not None:
            outcome = self.staleness.apply(sample, current_version)
            if outcome.sample is None:
                reason = STALE
            else:
                sample, masked = outcome.sample, outcome.masked_tokens
        if reason is None:
            self._pending_ids.add(sample.sample_id)
            self._entries.append((position, sample, None, None))
            self._kept += 1
            self._kept_tokens += sample.num_tokens
            if masked:
                self._masked[sample.sample_id] = masked
        else:
            self._entries.append((position, None, reason, sample.sample_id if reason == STALE else None))
        return reason

    def drop_kept(self, drop: Callable[[TrainSample], bool], reason: str) -> int:
        """Turn pending samples ``drop`` picks into rejects with ``reason`` (counted like any filter); how many."""
        dropped = 0
        for i, (position, sample, _reason, _stale) in enumerate(self._entries):
            if sample is not None and drop(sample):
                self._entries[i] = (position, None, reason, None)
                self._pending_ids.discard(sample.sample_id)
                self._masked.pop(sample.sample_id, None)
                self._kept -= 1
                self._kept_tokens -= sample.num_tokens
                dropped += 1
        return dropped

    def reject(self, reason: str, position: P) -> None:
        """Counts an item that never became a sample (e.g. undecodable)."""
        self._entries.append((position, None, reason, None))

    def full(self) -> bool:
        if self._kept >= self.batch_size:
            return True
        return self.max_batch_tokens is not None and self._kept_tokens >= self.max_batch_tokens

    def has_pending(self) -> bool:
        return bool(self._entries)

    def take(self) -> Batch[P]:
        entries, self._entries = self._entries, []
        masked, self._masked = self._masked, {}
        self._kept = self._kept_tokens = 0
        for sample_id in self._pending_ids:
            self._recent[sample_id] = None
        self._pending_ids = set()
        while len(self._recent) > self.dedupe_window:
            self._recent.popitem(last=False)
        samples = [s for _, s, _, _ in entries if s is not None]
        return Batch(
            samples=samples,
            filtered=Counter(r for _, _, r, _ in entries if r is not None),
            positions=[pos for pos, _, _, _ in entries],
            stale_dropped_ids=[d for _, _, _, d in entries if d is not None],
            stale_masked_tokens=sum(masked.get(s.sample_id, 0) for s in samples),
        )

    def retain(self, keep: Callable[[P], bool]) -> int:
        """Forgets pending items whose position fails ``keep`` (e.g. their partition was revoked,
        so another consumer will read them again); returns how many were forgotten."""
        before = len(self._entries)
        self._entries = [e for e in self._entries if keep(e[0])]
        kept = [s for _, s, _, _ in self._entries if s is not None]
        self._pending_ids = {s.sample_id for s in kept}
        self._masked = {k: v for k, v in self._masked.items() if k in self._pending_ids}
        self._kept, self._kept_tokens = len(kept), sum(s.num_tokens for s in kept)
        return before - len(self._entries)


def batches_from_samples(samples: Iterable[tuple[TrainSample, P]], batch_size: int, current_version: int,
                         filters: Sequence[SampleFilter] = (),
                         max_batch_tokens: int | None = None,
                         staleness: StalenessBound | None = None) -> Iterator[Batch[P]]:
    """Cuts an in-memory stream into batches (the last one may be partial); for tests and replay."""
    builder: BatchBuilder[P] = BatchBuilder(batch_size, max_batch_tokens, filters, staleness=staleness)
    for sample, position in samples:
        builder.add(sample, position, current_version)
        if builder.full():
            yield builder.take()
    if builder.has_pending():
        yield builder.take()
