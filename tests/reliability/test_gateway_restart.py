"""Fault (d) of ``tokentrail reliability``: a gateway process restarted (SIGTERM, then kill -9) under a live
openai-SDK session on the shared broker; the session goes on with its key, nothing is lost or duplicated,
and the attempt assembles COMPLETE with the finish's counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.faults import Sizes
from reliability.gateway_restart import NAME, gateway_restart
from tokentrail.settings import Settings

pytestmark = pytest.mark.e2e

SMALL = Sizes(rollouts_per_phase=1, calls_per_rollout=2, worker_groups=1, worker_kills=0, sink_kills=0)


def test_a_gateway_restarted_twice_mid_session_loses_nothing_and_the_rollout_completes(
    kafka_bootstrap: str, tokentrail_settings: Settings, tmp_path: Path
) -> None:
    lines: list[str] = []
    result = gateway_restart(tokentrail_settings, tmp_path, SMALL, lines.append)
    assert result.name == NAME
    assert (result.lost, result.duplicated) == (0, 0), result.detail
    assert result.passed, result.detail
    assert "SIGTERM: the successor answered" in result.detail and "kill -9: the successor answered" in result.detail
    assert "rollout COMPLETE" in result.detail
    assert any("replaced after kill -9" in line for line in lines)
