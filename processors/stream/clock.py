"""Per-partition stream time: the newest event time seen, advanced by the wall clock since.

Timeouts (attempt expiry, group windows) compare event timestamps with "now". Pure wall time would
expire replayed or back-filled data at once; pure event time would never expire the last attempt of
a quiet partition. This clock is the newest event time of the partition plus the wall time elapsed
since it was seen, and never runs backwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class PartitionClocks:
    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._anchors: dict[int, tuple[int, float]] = {}  # partition -> (event time us, monotonic s)

    def observe(self, partition: int, event_us: int) -> None:
        """An event with time ``event_us`` was processed on ``partition``."""
        current = self.now_us(partition)
        if current is None or event_us > current:
            self._anchors[partition] = (int(event_us), self._monotonic())

    def now_us(self, partition: int) -> int | None:
        """Stream time of the partition; None before any event (or seed) was seen on it."""
        anchor = self._anchors.get(partition)
        if anchor is None:
            return None
        event_us, seen_at = anchor
        return event_us + round((self._monotonic() - seen_at) * 1e6)

    def forget(self, partition: int) -> None:
        self._anchors.pop(partition, None)

    def known(self) -> set[int]:
        return set(self._anchors)
