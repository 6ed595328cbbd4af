"""Exactly once, from the trainer's own record: which samples the TrainerStep events say were trained,
how often, and which produced samples no event accounts for. Pure: events and ids in, figures out.

Events are counted once per event id (a re-emitted event, e.g. after a crash between publishing a policy
and emitting its step, is the same event). A sample is accounted for when a step trained it or named it
as dropped by the staleness bound (``stale_dropped_ids``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ExactlyOnce:
    steps: int  # distinct training steps (events that trained something)
    ranks: tuple[int, ...]  # the rank counts the steps ran with
    samples_trained: int  # distinct samples trained
    trained_twice: list[str] = field(default_factory=list)  # ids in more than one step
    lost: list[str] = field(default_factory=list)  # produced ids no step trained or dropped
    rank_samples: Mapping[int, int] = field(default_factory=dict)  # rank -> samples it trained

    @property
    def ok(self) -> bool:
        return not self.trained_twice and not self.lost

    def figures(self) -> dict[str, Any]:
        return {"steps": self.steps, "ranks": max(self.ranks, default=0), "samples_trained": self.samples_trained,
                "samples_trained_twice": len(self.trained_twice), "samples_lost": len(self.lost),
                "rank_samples": {str(k): v for k, v in sorted(self.rank_samples.items())}}


def exactly_once(events: Iterable[Mapping[str, Any]], produced_ids: Iterable[str]) -> ExactlyOnce:
    by_id = {e["event_id"]: e for e in events}
    trained: Counter[str] = Counter()
    dropped: set[str] = set()
    ranks: set[int] = set()
    rank_samples: Counter[int] = Counter()
    steps = 0
    for e in by_id.values():
        dropped.update(e.get("stale_dropped_ids") or ())
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
        rank_samples=dict(rank_samples))
