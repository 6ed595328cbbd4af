"""Fault (h) of `tokentrail reliability`: processor workers added, stopped with SIGTERM and killed -9 while
a steady workload is produced; the outputs equal what the pure core derives from the same inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.rebalance_chaos import ChaosSizes, run_rebalance_chaos
from tokentrail.settings import Settings

pytestmark = pytest.mark.e2e

# Three changes (add, SIGTERM, kill -9) a quarter of a minute apart; the command runs 20-30 s apart.
SHORT = ChaosSizes(duration_s=40.0, pause_s=(14.0, 18.0), group_every_s=3.0, partitions=4)


def test_workers_added_and_removed_under_a_steady_workload_give_the_pure_cores_outputs(
        kafka_bootstrap: str, tokentrail_settings: Settings, tmp_path: Path) -> None:
    run = run_rebalance_chaos(tokentrail_settings, tmp_path, SHORT, print, seed=3)
    result = run.result
    assert result.passed, f"{result.name}: {result.tried}; {result.detail}"
    assert (result.lost, result.duplicated) == (0, 0), result
    assert [kind for kind, _, _ in run.changes][:3] == ["add", "sigterm", "kill -9"]
    assert [workers for _, _, workers in run.changes][:3] == [3, 2, 1]
    assert "outputs equal a clean run's" in result.detail
