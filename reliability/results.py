"""Outcomes of corpus cases and fault scenarios, and the summary table both print."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CaseResult:
    id: str
    area: str
    klass: str
    what: str
    passed: bool
    detail: str = ""
    gap: str | None = None  # set when the case documents a known gap and the gap is still open


@dataclass
class FaultResult:
    name: str
    tried: str
    lost: int
    duplicated: int
    passed: bool
    detail: str = ""
    redelivered: int = 0  # identical copies of one event id (deduplicated downstream by id)
    seconds: float = 0.0


@dataclass
class Summary:
    cases: list[CaseResult] = field(default_factory=list)
    faults: list[FaultResult] = field(default_factory=list)
    accepted_lost: int = 0  # calls acknowledged before the bad inputs that are not on Kafka
    accepted_checked: int = 0
    health_ok: bool = True

    @property
    def lost(self) -> int:
        return self.accepted_lost + sum(f.lost for f in self.faults)

    @property
    def duplicated(self) -> int:
        return sum(f.duplicated for f in self.faults)

    @property
    def failed_cases(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.passed]

    @property
    def open_gaps(self) -> list[CaseResult]:
        return [c for c in self.cases if c.passed and c.gap]

    @property
    def ok(self) -> bool:
        return (not self.failed_cases and self.health_ok and self.lost == 0 and self.duplicated == 0
                and all(f.passed for f in self.faults))

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "lost": self.lost, "duplicated": self.duplicated,
            "faults": len(self.faults), "faults_passed": sum(f.passed for f in self.faults),
            "bad_inputs": len(self.cases), "bad_inputs_passed": sum(c.passed for c in self.cases),
            "security": sum(c.area == "security" for c in self.cases),
            "security_passed": sum(c.passed for c in self.cases if c.area == "security"),
            "known_gaps": [c.id for c in self.open_gaps], "failed": [c.id for c in self.failed_cases],
            "accepted_before_bad_inputs": self.accepted_checked, "gateway_health_after": self.health_ok,
        }


def table(summary: Summary) -> str:
    """One line per input class and per fault: what was tried, what was lost, what was duplicated."""
    rows: list[tuple[str, str, str, str, str]] = [("kind", "class / fault", "tried", "lost", "duplicated")]
    by_class: dict[tuple[str, str], list[CaseResult]] = defaultdict(list)
    for case in summary.cases:
        by_class[(case.area, case.klass)].append(case)
    for (area, klass), cases in sorted(by_class.items()):
        failed = [c for c in cases if not c.passed]
        tried = f"{len(cases)} cases, {len(cases) - len(failed)} answered as expected"
        gaps = [c for c in cases if c.gap]
        if gaps:
            tried += f" ({len(gaps)} known gap{'s' if len(gaps) > 1 else ''})"
        rows.append((f"input/{area}", klass, tried, "0" if not failed else f"{len(failed)} FAILED", "0"))
    if summary.cases:
        rows.append(("input/all", "accepted before the bad inputs",
                     f"{summary.accepted_checked} records, gateway /health after: "
                     f"{'200' if summary.health_ok else 'NOT 200'}", str(summary.accepted_lost), "0"))
    for fault in summary.faults:
        tried = fault.tried + (f"; {fault.redelivered} identical redeliveries" if fault.redelivered else "")
        rows.append(("fault", fault.name + ("" if fault.passed else " FAILED"), f"{tried} ({fault.seconds:.0f}s)",
                     str(fault.lost), str(fault.duplicated)))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
