"""Which policy versions serve a release track, folded from its ReleaseDecision events (the traffic part only).

The gateway routes by this and may not import processors/, so the part of the decisions fold it needs (the
versions, the candidate's fraction, the release id that salts routing, the pins) lives in the contract. It
applies the same sequence rule as ``processors.release.events.DecisionLog``: a decision counts only when it
carries the track's next sequence number; a stale or malformed one is set aside and changes nothing.
Standard library only; the controller's totals and plan stay in processors/release/.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.release_routing import route

TRAFFIC_ACTIONS = ("start", "ramp", "promote", "rollback", "pin")


class MalformedDecision(ValueError):
    """A ReleaseDecision record whose traffic fields cannot be read."""


@dataclass(frozen=True)
class Traffic:
    """One track's traffic after its decisions so far; ``sequence`` is the next decision's number."""

    model: str
    serving_version: int
    candidate_version: int | None = None
    candidate_fraction: float = 0.0
    release_id: str = ""
    pinned: Mapping[str, int] = field(default_factory=dict)
    sequence: int = 0

    def version_for(self, session_key: str, label: str | None = None) -> int:
        return route(session_key, release_id=self.release_id, serving_version=self.serving_version,
                     candidate_version=self.candidate_version, candidate_fraction=self.candidate_fraction,
                     pinned=self.pinned, label=label)

    def served_versions(self) -> frozenset[int]:
        """Every version some session may be routed to now."""
        versions = {self.serving_version, *self.pinned.values()}
        if self.candidate_version is not None and self.candidate_fraction > 0.0:
            versions.add(self.candidate_version)
        return frozenset(versions)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "serving_version": self.serving_version,
                "candidate_version": self.candidate_version, "candidate_fraction": self.candidate_fraction,
                "release_id": self.release_id, "pinned": dict(sorted(self.pinned.items())),
                "decisions": self.sequence}


def traffic_after(record: Mapping[str, Any]) -> Traffic:
    """The track's traffic right after the decision ``record``; MalformedDecision when it cannot be read."""
    try:
        action = record["action"]
        if action not in TRAFFIC_ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        if not isinstance(json.loads(record["plan_json"]), dict):
            raise ValueError("plan_json is not a JSON object")
        pinned = {str(k): int(v) for k, v in json.loads(record["pinned_json"]).items()}
        serving = int(record["serving_version"])
        raw_candidate = record["candidate_version"]
        candidate = None if raw_candidate is None else int(raw_candidate)
        fraction = float(record["candidate_fraction"])
        traffic = Traffic(model=str(record["model"]), serving_version=serving, candidate_version=candidate,
                          candidate_fraction=fraction, release_id=str(record["release_id"]), pinned=pinned,
                          sequence=int(record["sequence"]) + 1)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedDecision(f"ReleaseDecision {record.get('event_id')!r} is malformed: {exc}") from exc
    if action == "promote" and candidate is not None:
        return Traffic(traffic.model, candidate, None, 0.0, traffic.release_id, pinned, traffic.sequence)
    if action == "rollback" or candidate is None:
        return Traffic(traffic.model, serving, None, 0.0, traffic.release_id, pinned, traffic.sequence)
    return traffic


@dataclass
class TrafficLog:
    """Every track's traffic, folded from decisions in topic order; stale and malformed ones counted."""

    tracks: dict[str, Traffic] = field(default_factory=dict)
    stale: int = 0
    rejected: list[str] = field(default_factory=list)

    @classmethod
    def fold(cls, records: Iterable[Mapping[str, Any]]) -> TrafficLog:
        log = cls()
        for record in records:
            log.add(record)
        return log

    def add(self, record: Mapping[str, Any]) -> bool:
        """Fold one decision; False when it is stale or malformed (nothing changes then)."""
        model = record.get("model")
        current = self.tracks.get(model) if isinstance(model, str) else None
        if record.get("sequence") != (current.sequence if current is not None else 0):
            self.stale += 1
            return False
        try:
            self.tracks[str(model)] = traffic_after(record)
        except MalformedDecision as exc:
            self.rejected.append(str(exc))
            return False
        return True
