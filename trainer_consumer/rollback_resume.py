"""A rollback tells the trainer: resume from the last good version (docs/release.md).

The trainer publishes versions in one line (v1, v2, ...), each trained from the one before. When the release
controller (or an operator) rolls a candidate back, every version the trainer published from the candidate on
carries what made the candidate worse. So the trainer follows the release decisions of its model
(``schemas.kafka.release_follower.ReleaseFollower``) and, before its next step after a rollback of a candidate its
weights descend from, it

1. loads the version the rollback kept serving (the last good one) from the policy store,
2. clears the optimizer's moments (they were gathered on the abandoned line),
3. publishes those weights at once as its next version (versions only move forward, and engines that follow
   ``latest`` get the good weights back), with the rollback in the version's metadata: ``resumed_from``,
   ``rolled_back_candidate``, ``rollback_decision`` and ``release_sequence`` (the last decision accounted
   for, carried by every later version of the run, so a restarted trainer does not resume twice),
4. and records the resume as an immutable event: a TrainerStep with no samples whose ``resumed_from_version``,
   ``rolled_back_version``, ``resume_release_id``, ``resume_decision_id`` and ``resume_reason`` say what
   happened (``trainer_consumer.events.trainer_resume_record``; the loop emits it before it publishes).

``resume_due`` is the pure rule; ``RollbackResumer`` applies it to a training loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Decision = Mapping[str, Any]
RELEASE_SEQUENCE = "release_sequence"  # policy metadata: the last release decision the run accounted for


@dataclass(frozen=True)
class Resume:
    decision_id: str
    sequence: int
    rolled_back: int  # the candidate version the decision took out of traffic
    resume_from: int  # the version it kept serving: the last good one
    release_id: str = ""  # the release the rollback ended
    reason: str = ""  # who rolled back, by which rule, and why (from the decision)


def _reason(record: Decision) -> str:
    rule = record.get("rule") or "manual"
    why = record.get("reason") or ""
    return f"{record.get('source', 'operator')} rollback ({rule}){': ' + why if why else ''}"


def resume_due(applied: Sequence[Decision], current_version: int, handled_sequence: int) -> Resume | None:
    """The resume the trainer owes, if any: the newest rollback after ``handled_sequence`` whose candidate its
    weights descend from (``current_version`` at or after the candidate: the trainer's versions form one line).
    A rollback of a candidate newer than the trainer's weights (another run's) leaves them alone."""
    for record in reversed(applied):
        if int(record["sequence"]) <= handled_sequence:
            return None
        candidate = record.get("candidate_version")
        if record["action"] == "rollback" and candidate is not None and current_version >= int(candidate):
            return Resume(str(record["event_id"]), int(record["sequence"]), int(candidate),
                          int(record["serving_version"]), str(record.get("release_id") or ""), _reason(record))
    return None


class RollbackResumer:
    """Applied by the training loop before each step: resumes on a due rollback, and keeps count of the
    decisions accounted for (``handled_sequence``, stored with every version the loop publishes)."""

    def __init__(self, applied: Callable[[], Sequence[Decision]], load_weights: Callable[[int], dict[str, Any]],
                 handled_sequence: int = -1, progress: Callable[[str], None] = lambda _line: None) -> None:
        self.applied, self.load_weights, self.progress = applied, load_weights, progress
        self.handled_sequence = handled_sequence
        self.resumes: list[dict[str, Any]] = []

    def metadata(self) -> dict[str, Any]:
        """What every version published by the loop carries."""
        return {RELEASE_SEQUENCE: self.handled_sequence}

    def check(self, model: Any, optimizer: Any, current_version: int,
              publish: Callable[[Resume, dict[str, Any]], int]) -> Resume | None:
        """Resume if due: load the good weights into ``model``, clear ``optimizer``'s state, and
        ``publish(resume, metadata) -> the version published`` (the loop records the resume event there).
        Returns the resume applied, if any."""
        applied = self.applied()
        resume = resume_due(applied, current_version, self.handled_sequence)
        if applied:
            self.handled_sequence = max(self.handled_sequence, int(applied[-1]["sequence"]))
        if resume is None:
            return None
        model.load_state_dict(self.load_weights(resume.resume_from), strict=True)
        optimizer.state.clear()
        version = publish(resume, {"resumed_from": resume.resume_from, "rolled_back_candidate": resume.rolled_back,
                                   "rollback_decision": resume.decision_id, **self.metadata()})
        self.resumes.append({"version": version, "resumed_from": resume.resume_from,
                             "rolled_back_candidate": resume.rolled_back, "rollback_decision": resume.decision_id})
        self.progress(f"release rollback of v{resume.rolled_back} (decision {resume.sequence}): resumed from "
                      f"v{resume.resume_from}, published as v{version}")
        return resume
