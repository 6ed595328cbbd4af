"""Exactly once, from the trainer's own record: which samples the TrainerStep events say were trained,
how often, and which produced samples no event accounts for. Pure: events and ids in, figures out.

Events are counted once per event id (a re-emitted event, e.g. after a crash between publishing a policy
and emitting its step, is the same event). A sample is accounted for by name when a step trained it or
named it as dropped by the staleness bound (``stale_dropped_ids``); the other filters (zero weight,
malformed, ...) count their samples by reason only (``filtered_json``), so ``samples_lost`` is the ids
accounted for by no name less those counts. Redelivered copies (``duplicate``) and undecodable records
(``decode_error:*``, never a sample id) are not samples left untrained, and are not subtracted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from trainer_consumer.batching import DUPLICATE, STALE

# Filter reasons whose samples are named elsewhere (stale) or are not an untrained sample (a duplicate copy).
NAMED_OR_NOT_A_SAMPLE = frozenset({STALE, DUPLICATE})


@dataclass(frozen=True)
class ExactlyOnce:
    steps: int  # distinct training steps (events that trained something)
    ranks: tuple[int, ...]  # the rank counts the steps ran with
    samples_trained: int  # distinct samples trained
    trained_twice: list[str] = field(default_factory=list)  # ids in more than one step
    lost: list[str] = field(default_factory=list)  # produced ids no step trained or dropped
    rank_samples: Mapping[int, int] = field(default_factory=dict)  # rank -> samples it trained
    filtered_unnamed: int = 0  # samples filters dropped by count only (not stale, duplicate or undecodable)

    @property
    def samples_lost(self) -> int:
        return max(0, len(self.lost) - self.filtered_unnamed)

    @property
    def ok(self) -> bool:
        return not self.trained_twice and self.samples_lost == 0

    def figures(self) -> dict[str, Any]:
        return {"steps": self.steps, "ranks": max(self.ranks, default=0), "samples_trained": self.samples_trained,
                "samples_trained_twice": len(self.trained_twice), "samples_lost": self.samples_lost,
                "samples_filtered_by_count": self.filtered_unnamed,
                "rank_samples": {str(k): v for k, v in sorted(self.rank_samples.items())}}


def exactly_once(events: Iterable[Mapping[str, Any]], produced_ids: Iterable[str]) -> ExactlyOnce:
    by_id = {e["event_id"]: e for e in events}
    trained: Counter[str] = Counter()
    dropped: set[str] = set()
    ranks: set[int] = set()
    rank_samples: Counter[int] = Counter()
    steps = 0
    unnamed = 0
    for e in by_id.values():
        dropped.update(e.get("stale_dropped_ids") or ())
        for reason, n in orjson.loads(e.get("filtered_json") or "{}").items():
            if reason not in NAMED_OR_NOT_A_SAMPLE and not reason.startswith("decode_error"):
                unnamed += int(n)
        if not e["sample_ids"]:
            continue
        steps += 1
        ranks.add(int(e.get("ranks", 1)))
        trained.update(e["sample_ids"])
        rank_samples.update(e.get("sample_ranks") or [0] * len(e["sample_ids"]))
    produced = list(dict.fromkeys(produced_ids))
    return ExactlyOnce(
        steps=steps, ranks=tuple(sorted(ranks)), samples_trained=len(trained),
        trained_twice=sorted(i for i, n in trained.items() if n > 1),
        lost=[i for i in produced if i not in trained and i not in dropped],
        rank_samples=dict(rank_samples), filtered_unnamed=unnamed)
