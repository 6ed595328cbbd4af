"""Run verifiers with a time limit and crash capture; every outcome becomes a Score record.

Isolation per verifier:
  * ``thread`` (default): the call runs in a daemon thread; on time-out the score is TIMEOUT and the
    thread is abandoned (Python cannot kill it), so use it for verifiers that cannot hang for good.
  * ``process``: the call runs in a fresh process (forkserver), killed on time-out; for untrusted
    or crash-prone code. The verifier is re-loaded in the child from its import path and options.
An exception (or a child that dies) gives an ERROR score with the exception text; nothing escapes.

Score ids are defined by what was scored and by whom (rollout event, group event for group scope,
verifier name and version), never by the outcome, so re-running a group re-emits the same ids.
``duration_ms`` is the one measured field; pass ``timer`` for fully reproducible records.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from processors.jsonutil import NotCanonicalJSON, canonical_json
from processors.verifiers.base import RolloutView, Verifier, load_verifier
from schemas.ids import event_id

Record = dict[str, Any]
MAX_ERROR_CHARS = 4000


@dataclass(frozen=True)
class Outcome:
    status: str  # OK | ERROR | TIMEOUT
    value: Any = None
    error: str | None = None
    duration_ms: float = 0.0


def _describe(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-MAX_ERROR_CHARS:]


def _in_thread(fn: Callable[[], Any], timeout_s: float) -> tuple[str, Any, str | None]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # a verifier crash must not escape, whatever it raises
            box["error"] = _describe(exc)

    thread = threading.Thread(target=target, name="verifier", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return "TIMEOUT", None, f"verifier did not return within {timeout_s:g}s (thread abandoned)"
    if "error" in box:
        return "ERROR", None, box["error"]
    return "OK", box.get("value"), None


def _child(ref: str, options: dict[str, Any], method: str, args: tuple[Any, ...], conn: Any) -> None:
    try:
        verifier = load_verifier(ref, **options)
        conn.send(("OK", getattr(verifier, method)(*args), None))
    except BaseException as exc:
        conn.send(("ERROR", None, _describe(exc)))
    finally:
        conn.close()


def _in_process(verifier: Verifier, method: str, args: tuple[Any, ...],
                timeout_s: float) -> tuple[str, Any, str | None]:
    ctx = multiprocessing.get_context("forkserver")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(verifier.ref, verifier.raw_options, method, args, child),
                       daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(timeout_s):
            try:
                return parent.recv()
            except EOFError:
                pass
            proc.join(1.0)
            return "ERROR", None, f"verifier process died (exit code {proc.exitcode})"
        return "TIMEOUT", None, f"verifier process did not return within {timeout_s:g}s (killed)"
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5.0)
        parent.close()


@dataclass
class VerifierRunner:
    """Runs verifiers; ``timer`` measures duration_ms (a constant timer makes records reproducible)."""

    timer: Callable[[], float] = field(default=time.perf_counter)

    def _call(self, verifier: Verifier, method: str, args: tuple[Any, ...]) -> Outcome:
        start = self.timer()
        if verifier.isolation == "process":
            status, value, error = _in_process(verifier, method, args, verifier.timeout_s)
        else:
            status, value, error = _in_thread(lambda: getattr(verifier, method)(*args), verifier.timeout_s)
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
