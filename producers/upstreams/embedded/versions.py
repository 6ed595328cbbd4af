"""The policy versions the embedded engine keeps in memory: a bounded LRU of state dicts.

A release serves several versions at once (docs/release.md); switching the model between them costs one
``load_state_dict`` from a resident copy, while loading a version from the policy store reads and checks
its file. So the engine keeps up to ``max_versions`` copies, evicting the least recently used one, but
never a protected version (one the release plan serves, or the engine's default): when only protected
versions are left the bound is exceeded rather than a served version dropped. Changed by the engine's one
worker thread only, so it needs no lock; other threads (/health) read ``versions()``, an immutable snapshot.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import torch

StateDict = dict[str, torch.Tensor]


class ResidentVersions:
    def __init__(self, max_versions: int) -> None:
        if max_versions < 1:
            raise ValueError(f"max_versions must be at least 1, got {max_versions}")
        self.max_versions = max_versions
        self._states: OrderedDict[int, StateDict] = OrderedDict()
        self._protected: frozenset[int] = frozenset()
        self._order: tuple[int, ...] = ()  # snapshot of the LRU order, replaced whole after each change

    def __contains__(self, version: int) -> bool:
        return version in self._states

    def versions(self) -> list[int]:
        """Resident versions, least recently used first (safe to call from any thread)."""
        return list(self._order)

    @property
    def protected(self) -> frozenset[int]:
        return self._protected

    def get(self, version: int) -> StateDict | None:
        state = self._states.get(version)
        if state is not None:
            self._states.move_to_end(version)
            self._order = tuple(self._states)
        return state

    def put(self, version: int, state: StateDict) -> list[int]:
        """Keep ``state`` as ``version`` (most recently used); returns the versions evicted for room."""
        self._states[version] = state
        self._states.move_to_end(version)
        return self._evict(keep=version)

    def protect(self, versions: Iterable[int]) -> list[int]:
        """Versions that must stay resident from now on (replaces the previous set); returns evictions."""
        self._protected = frozenset(versions)
        return self._evict(keep=None)

    def _evict(self, keep: int | None) -> list[int]:
        evicted: list[int] = []
        for version in list(self._states):  # least recently used first
            if len(self._states) <= self.max_versions:
                break
            if version in self._protected or version == keep:
                continue
            del self._states[version]
            evicted.append(version)
        self._order = tuple(self._states)
        return evicted
