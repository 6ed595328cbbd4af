"""Small helpers shared by the benchmarks: timing loops and the closing JSON line."""

from __future__ import annotations

import json
import time
from collections.abc import Callable


def best_time(fn: Callable[[], object], repeat: int = 5, number: int = 1) -> float:
    """Best wall time of ``number`` calls, over ``repeat`` runs (seconds per call)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def emit(figures: dict[str, object]) -> None:
    """Print the figures for a person, then the machine-readable last line."""
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        shown = f"{value:,.3f}" if isinstance(value, float) else str(value)
        print(f"  {key:<{width}}  {shown}")
    print(json.dumps(figures, sort_keys=True))
