"""The fault scenarios of `tokentrail reliability`, each on a small workload (the quick variant of the
command runs them larger): real broker, gateway, worker and sink processes, kill -9 and restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.faults import Sizes, broker_and_gateway, double_delivery, worker_and_sink_kills
from reliability.results import FaultResult
from tokentrail.settings import Settings

pytestmark = pytest.mark.e2e

SMALL = Sizes(rollouts_per_phase=3, calls_per_rollout=1, worker_groups=2, worker_kills=3, sink_kills=1)


def _check(result: FaultResult) -> None:
    assert result.passed, f"{result.name}: {result.tried}; {result.detail}"
    assert (result.lost, result.duplicated) == (0, 0), result


def test_broker_restart_and_gateway_kill_with_a_spool_lose_and_duplicate_nothing(
        kafka_bootstrap: str, tokentrail_settings: Settings, tmp_path: Path) -> None:
    results = broker_and_gateway(tokentrail_settings, tmp_path, SMALL, print)
    assert [r.name[0] for r in results] == ["a", "e"]
    for result in results:
        _check(result)
    assert "answered while the broker was down" in results[0].tried


def test_worker_and_sink_kill_9_outputs_equal_a_clean_run_and_rows_are_unique(
        kafka_bootstrap: str, tokentrail_settings: Settings, tmp_path: Path) -> None:
    results = worker_and_sink_kills(tokentrail_settings, tmp_path, SMALL, print, seed=1)
    assert [r.name[0] for r in results] == ["b", "c"]
    for result in results:
        _check(result)


def test_records_delivered_twice_give_no_duplicate_samples(
        kafka_bootstrap: str, tokentrail_settings: Settings, tmp_path: Path) -> None:
    _check(double_delivery(tokentrail_settings, tmp_path, SMALL, print))
