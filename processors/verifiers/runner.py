"""Every verifier outcome becomes a Score record: OK, ERROR (with the exception text) or TIMEOUT.

How a verifier is called (a thread or a fresh process, with its time limit) is I/O and lives in
``processors.isolation.calls``; the runner is given that call (``verifier_runner()`` builds it), so
this module stays pure and a test can give it any call.

Score ids are defined by what was scored and by whom (rollout event, group event for group scope,
verifier name and version), never by the outcome, so re-running a group re-emits the same ids.
``duration_ms`` is the one measured field; pass ``timer`` for fully reproducible records.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from processors.jsonutil import NotCanonicalJSON, canonical_json
from processors.verifiers.base import RolloutView, Verifier
from schemas.ids import event_id

Record = dict[str, Any]
# (status, value, error) of ``verifier.<method>(*args)``: OK | ERROR | TIMEOUT.
CallVerifier = Callable[[Verifier, str, tuple[Any, ...]], tuple[str, Any, str | None]]


@dataclass(frozen=True)
class Outcome:
    status: str  # OK | ERROR | TIMEOUT
    value: Any = None
    error: str | None = None
    duration_ms: float = 0.0


@dataclass
class VerifierRunner:
    """Runs verifiers through ``call`` (status, value, error of one verifier method); ``timer`` measures
    duration_ms (a constant timer makes records reproducible)."""

    call: CallVerifier
    timer: Callable[[], float] = field(default=time.perf_counter)

    def _call(self, verifier: Verifier, method: str, args: tuple[Any, ...]) -> Outcome:
        start = self.timer()
        status, value, error = self.call(verifier, method, args)
        return Outcome(status, value, error, round((self.timer() - start) * 1000, 3))

    def score_rollouts(self, verifier: Verifier, rollouts: list[Record], group: Record) -> list[Record]:
        """ROLLOUT scope: one Score per rollout."""
        scores = []
        for rollout in rollouts:
            outcome = self._call(verifier, "verify", (RolloutView.of(rollout),))
            scores.append(score_record(verifier, rollout, group, outcome))
        return scores

    def score_group(self, verifier: Verifier, rollouts: list[Record], group: Record,
                    prior: dict[str, dict[str, Any]]) -> list[Record]:
        """GROUP scope: one call for the group, one Score per rollout (ERROR for any it left out)."""
        views = [RolloutView.of(r) for r in rollouts]
        outcome = self._call(verifier, "verify_group", (views, prior))
        if outcome.status != "OK":
            return [score_record(verifier, r, group, outcome) for r in rollouts]
        value = outcome.value
        per: dict[str, Any] = {}
        problem = None
        if isinstance(value, dict):
            per = value
        elif isinstance(value, list) and len(value) == len(rollouts):
            per = {r["rollout_id"]: v for r, v in zip(rollouts, value, strict=True)}
        else:
            problem = (f"group verifier returned {type(value).__name__}; expected a dict by rollout id or a "
                       f"list of {len(rollouts)}")
        scores = []
        for r in rollouts:
            if problem is None and r["rollout_id"] in per:
                result = Outcome("OK", per[r["rollout_id"]], None, outcome.duration_ms)
            else:
                reason = problem or f"group verifier returned no result for rollout {r['rollout_id']}"
                result = Outcome("ERROR", None, reason, outcome.duration_ms)
            scores.append(score_record(verifier, r, group, result))
        return scores


def score_id(verifier_name: str, verifier_version: str, scope: str, rollout_event_id: str,
             group_event_id: str) -> str:
    return event_id("score", rollout_event_id, group_event_id if scope == "GROUP" else "", verifier_name,
                    verifier_version)


def score_record(verifier: Verifier, rollout: Record, group: Record, outcome: Outcome) -> Record:
    status, error = outcome.status, outcome.error
    raw_json = "null"
    if status == "OK":
        try:
            raw_json = canonical_json(outcome.value)
        except NotCanonicalJSON as exc:
            status = "ERROR"
            error = f"verifier output has no exact JSON form ({exc}): {repr(outcome.value)[:1000]}"
    scope = verifier.scope
    version = verifier.version_tag
    return {
        "event_id": score_id(verifier.name, version, scope, rollout["event_id"], group["event_id"]),
        "rollout_id": rollout["rollout_id"], "rollout_event_id": rollout["event_id"],
        "group_id": group["group_id"], "verifier_name": verifier.name, "verifier_version": version,
        "scope": scope, "status": status, "raw_json": raw_json, "error": error,
        "duration_ms": float(outcome.duration_ms),
        "created_at_us": int(group["created_at_us"] if scope == "GROUP" else rollout["created_at_us"]),
    }


def prior_raw(scores: list[Record]) -> dict[str, dict[str, Any]]:
    """{rollout_id: {verifier_name: parsed raw output}} of the OK scores, for group verifiers."""
    out: dict[str, dict[str, Any]] = {}
    for s in scores:
        if s["status"] == "OK":
            out.setdefault(s["rollout_id"], {})[s["verifier_name"]] = json.loads(s["raw_json"])
    return out
