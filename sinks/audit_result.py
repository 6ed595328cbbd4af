"""What one audit check found: pass/fail, how many things were checked and failed, and the failing ids
with the reason. Its own module so that every check module (sinks/audit.py, sinks/feedback_audit.py)
builds on it without importing another check module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

MAX_LISTED_FAILURES = 200


@dataclass(frozen=True)
class Failure:
    id: str  # the failing event's id (sample, rollout, reward, credit or score)
    kind: str  # the failing event's type
    reason: str


@dataclass
class CheckResult:
    key: str
    title: str
    checked: int = 0
    failures: list[Failure] = field(default_factory=list)
    failed_count: int = 0  # may exceed len(failures), which is capped
    notes: list[str] = field(default_factory=list)
    # Events of forgotten subjects: {"id", "kind", "request_id"}; neither verified nor failed (issue 31).
    forgotten: list[dict[str, str]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.failed_count == 0

    def fail(self, id_: str, kind: str, reason: str) -> None:
        self.failed_count += 1
        if len(self.failures) < MAX_LISTED_FAILURES:
            self.failures.append(Failure(id_, kind, reason))

    def failing_ids(self) -> list[str]:
        return sorted({f.id for f in self.failures})

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "passed": self.passed,
            "checked": self.checked,
            "failed": self.failed_count,
            "failures": [asdict(f) for f in self.failures],
            "notes": self.notes,
            "forgotten": self.forgotten,
        }
