"""Fault (n) of ``tokentrail reliability`` (issue 29): a ``--processes 4`` gateway with organic sessions, one
worker killed -9 mid-window and then the whole gateway restarted; every session ends as exactly one COMPLETE
rollout, nothing lost or duplicated."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.organic_sessions_fault import NAME, organic_sessions_fault
from tokentrail.settings import Settings

pytestmark = pytest.mark.e2e


def test_every_organic_session_is_one_complete_rollout_after_a_worker_kill_and_a_restart(
    kafka_bootstrap: str, tokentrail_settings: Settings, tmp_path: Path
) -> None:
    lines: list[str] = []
    result = organic_sessions_fault(tokentrail_settings, tmp_path, lines.append, sessions=6)
    assert result.name == NAME
    assert (result.lost, result.duplicated) == (0, 0), result.detail
    assert result.passed, result.detail
    assert "6 of 6 sessions one COMPLETE rollout" in result.detail and "0 split" in result.detail
    assert any("killed -9, restored" in line for line in lines), lines
