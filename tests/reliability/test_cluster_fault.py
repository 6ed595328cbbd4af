"""Fault (g) of `tokentrail reliability`: a private three-broker cluster (RF 3, min ISR 2) under a gateway
process and a steady workload; the calls partition's leader is killed -9 mid-run and restarted. Nothing
acknowledged is lost or duplicated, and the ISR shrank to two (a new leader) and re-grew to three."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.cluster_fault import ClusterFaultRun, ClusterSizes, acks_all_held, run_cluster_fault
from reliability.results import FaultResult
from tokentrail.kafka_cluster import PartitionState
from tokentrail.settings import Settings

pytestmark = pytest.mark.e2e

SMALL = ClusterSizes(rollouts_before=1, rollouts_while_down=2, rollouts_after=1, calls_per_rollout=1)


def _run(before: tuple[int, ...], during: tuple[int, ...], after: tuple[int, ...], leader_during: int = 2,
         min_isr: str = "2") -> ClusterFaultRun:
    return ClusterFaultRun(FaultResult("g", "", 0, 0, True), killed_node=1,
                           before=PartitionState(1, (1, 2, 3), before),
                           during=PartitionState(leader_during, (1, 2, 3), during),
                           after=PartitionState(2, (1, 2, 3), after), min_isr_config=min_isr)


def test_acks_all_held_needs_a_shrunk_then_regrown_isr_without_the_dead_leader() -> None:
    assert acks_all_held(_run((1, 2, 3), (2, 3), (1, 2, 3)))
    assert not acks_all_held(_run((1, 2), (2, 3), (1, 2, 3)))  # not fully in sync before the kill
    assert not acks_all_held(_run((1, 2, 3), (1, 2, 3), (1, 2, 3)))  # the dead broker still in the ISR
    assert not acks_all_held(_run((1, 2, 3), (2, 3), (1, 2, 3), leader_during=1))  # no new leader
    assert not acks_all_held(_run((1, 2, 3), (2,), (1, 2, 3)))  # below min ISR
    assert not acks_all_held(_run((1, 2, 3), (2, 3), (2, 3)))  # never re-grew
    assert not acks_all_held(_run((1, 2, 3), (2, 3), (1, 2, 3), min_isr="1"))  # topic not configured


def test_killing_the_calls_leader_of_a_three_broker_cluster_loses_and_duplicates_nothing(
        tokentrail_settings: Settings, tmp_path: Path) -> None:
    run = run_cluster_fault(tokentrail_settings, tmp_path, SMALL, print)
    result = run.result
    assert result.passed, f"{result.name}: {result.tried}; {result.detail}"
    assert (result.lost, result.duplicated) == (0, 0), result
    assert acks_all_held(run), run
    assert run.during is not None and run.killed_node not in run.during.isr
