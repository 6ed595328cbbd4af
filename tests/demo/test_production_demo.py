"""``tokentrail demo --production``, short: simulated users with no rollout creation, rewards from their
feedback alone, late and unmatched feedback, the five audit checks and a replay admitting the late feedback.

Runs the command as a person would, in a state directory of its own (its own Kafka broker on free ports,
its own ClickHouse and policy store), and checks what it prints last. Learning is not asserted: a run of a
minute trains on too few sessions for the reward to rise reliably.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokentrail.settings import REPO_ROOT

pytestmark = pytest.mark.e2e

KEYS = ("sessions", "feedback_events", "feedback_used", "feedback_late", "feedback_unmatched", "reward_improved",
        "audit_passed")


@pytest.mark.slow
def test_short_production_run_accounts_for_every_feedback(tmp_path: Path) -> None:
    state = tmp_path / "state"
    command = [sys.executable, "-m", "tokentrail.cli", "demo", "--production", "--minutes", "1", "--users", "3",
               "--late-fraction", "0.4", "--feedback-wait-s", "15", "--match-wait-s", "15", "--unmatched", "2",
               "--drain-s", "150", "--state-dir", str(state)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1500)
    report = _failure_report(result.stdout + result.stderr, state / "logs")
    assert result.returncode == 0, report
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(key in summary for key in KEYS), report
    assert summary["audit_passed"], report
    assert summary["sessions"] > 0 and summary["rollouts_complete"] >= summary["sessions"], report
    assert summary["feedback_used"] > 0 and summary["feedback_late"] > 0, report
    assert summary["feedback_unmatched"] == 2 and summary["feedback_refused"] == 0, report
    # Every feedback event is accounted for: used, late or unmatched (nothing pending after the drain).
    assert summary["feedback_events"] == (summary["feedback_used"] + summary["feedback_late"]
                                          + summary["feedback_unmatched"]), report
    # The replay admits every feedback sent late; rewards differ only on rollouts where late feedback landed,
    # and on every session whose feedback was all sent late.
    assert summary["replay_admits_the_late_sent"], report
    assert summary["replay_changed_only_where_late"] and summary["replay_changed_on_every_late_session"], report
    assert Path(summary["report"]).stat().st_size > 10_000
    assert "Kafka stopped" in result.stdout + result.stderr  # its own broker, stopped at the end


def _failure_report(output: str, logs: Path) -> str:
    """What the demo printed, then the end of every service's log: enough to see which stage stopped."""
    parts = [output[-6000:]]
    for log in sorted(logs.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        parts.append(f"----- {log.name} (last 40 of {len(lines)} lines)\n" + "\n".join(lines[-40:]))
    return "\n".join(parts)
