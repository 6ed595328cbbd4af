"""Fault (f) of `tokentrail reliability`: two gateway processes and three processor workers on a private
six-partition broker, one worker killed -9 mid-run; after the rebalance the outputs equal what a single
clean worker derives from the inputs on Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.scale_out import PARTITIONS, WORKERS, ScaleSizes, run_scale_out, spread_over
from tokentrail.settings import Settings

pytestmark = pytest.mark.e2e

SMALL = ScaleSizes(groups=4, group_size=4, calls_per_rollout=1)


def test_spread_over_needs_every_member_busy_and_every_partition_owned() -> None:
    assert spread_over([[0, 1], [2, 3], [4, 5]], 3, 6)
    assert not spread_over([[], [0, 1, 2], [3, 4, 5]], 3, 6)  # a member without partitions
    assert not spread_over([[0, 1, 2], [3, 4, 5]], 3, 6)  # only two members
    assert not spread_over([[0, 1], [2, 3], [4]], 3, 6)  # partition 5 unowned


@pytest.mark.slow
def test_two_gateways_three_workers_one_killed_outputs_equal_a_single_worker_run(
        tokentrail_settings: Settings, tmp_path: Path) -> None:
    run = run_scale_out(tokentrail_settings, tmp_path, SMALL, print, seed=1)
    result = run.result
    assert result.passed, f"{result.name}: {result.tried}; {result.detail}"
    assert (result.lost, result.duplicated) == (0, 0), result
    # Before the kill every one of the three workers held a share of the six input partitions.
    assert spread_over(run.assignment_before_kill, WORKERS, PARTITIONS), run.assignment_before_kill
    assert run.killed_pid is not None
    assert "16 rollouts in 4 groups of 4" in result.tried
    print(f"{result.seconds:.0f}s; assignment after the kill {run.assignment_after}; "
          f"{run.watchdog_restarts} watchdog restarts; {result.redelivered} identical redeliveries")
