"""A trainer rank killed -9 mid-step under torchrun --max-restarts: resumed, nothing trained twice or lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.rank_kill import rank_kill_fault

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_rank_killed_mid_step_resumes_with_no_sample_twice_or_lost(
        kafka_bootstrap, tokentrail_settings, tmp_path: Path) -> None:
    lines: list[str] = []
    result = rank_kill_fault(tokentrail_settings, tmp_path, progress=lines.append)
    assert result.passed, result.detail
    assert result.lost == 0 and result.duplicated == 0
    assert "killed -9" in result.detail and "restarts 1" in result.detail
    assert "trained 32/32 samples" in result.detail
