"""Per-partition stream time: the newest event time seen, advanced by the wall clock since.

Timeouts (attempt expiry, group windows) compare event timestamps with "now". Pure wall time would
expire replayed or back-filled data at once; pure event time would never expire the last attempt of
a quiet partition. This clock is the newest event time of the partition plus the wall time elapsed
since it was seen, and never runs backwards.

No event moves it further than ``MAX_FUTURE_SKEW_S`` ahead of the wall clock (issue 29): one record dated a
century ahead would otherwise close every window of its partition at once, for good, since the newest time
is kept in every entry's header and seeds the clock again after a restart; a seed is capped the same way.
Replayed and back-filled data (times in the past) are untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MAX_FUTURE_SKEW_S = 300.0  # as far ahead of the wall clock as the gateway lets an event time be


class PartitionClocks:
    def __init__(self, monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 max_future_skew_s: float = MAX_FUTURE_SKEW_S) -> None:
        self._monotonic = monotonic
        self._wall = wall
        self._max_future_us = round(max_future_skew_s * 1e6)
        self._anchors: dict[int, tuple[int, float]] = {}  # partition -> (event time us, monotonic s)

    def observe(self, partition: int, event_us: int) -> None:
        """An event with time ``event_us`` was processed on ``partition`` (counted at most the skew ahead)."""
        event_us = min(int(event_us), round(self._wall() * 1e6) + self._max_future_us)
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
