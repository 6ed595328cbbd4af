"""Fault (l): a worker running the baseline agents killed -9 twice mid-stream and restarted (real broker,
real worker processes): the Baseline events, the feedback rewards and the rewards, credits and samples
measured against the baselines equal a clean run's (the pure core on the same inputs): none missing, none
unexpected, every copy identical, no input left unmeasured."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.baseline_kills import baseline_worker_kills
from tokentrail.settings import Settings

pytestmark = pytest.mark.e2e


def test_baseline_agents_killed_mid_stream_give_a_clean_runs_events(
        kafka_bootstrap: str, tokentrail_settings: Settings, tmp_path: Path) -> None:
    result = baseline_worker_kills(tokentrail_settings, tmp_path, print, sessions=24, seed=1)
    assert result.passed, f"{result.name}: {result.tried}; {result.detail}"
    assert (result.lost, result.duplicated) == (0, 0), result
    assert "of 9 windows out" in result.tried and "'Baseline': 9" in result.tried, result.tried
