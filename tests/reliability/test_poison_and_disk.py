"""Faults (j) and (k) of `tokentrail reliability`: a 5 MB request and a record over the broker's limit
between good rollouts (refused up front / quarantined, nothing blocked behind them), and a gateway whose
spool fills its disk (a tmpfs the scenario mounts) with the broker down. No acknowledged record is lost
or duplicated, and the gateway's spool is empty again afterwards."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reliability.poison_and_disk import DISK_NAME, POISON_NAME, PoisonDiskSizes, poison_and_disk
from tokentrail.settings import Settings

pytestmark = pytest.mark.e2e

SMALL = PoisonDiskSizes(rollouts_around=1, calls_per_rollout=1, poison_bytes=5_000_000, disk_mb=64)


def test_a_poison_record_and_a_full_spool_disk_lose_and_block_nothing(
        tokentrail_settings: Settings, tmp_path: Path) -> None:
    poison, disk = poison_and_disk(tokentrail_settings, tmp_path, SMALL, print)
    assert (poison.name, disk.name) == (POISON_NAME, DISK_NAME)
    for result in (poison, disk):
        assert result.passed, f"{result.name}: {result.tried}; {result.detail}"
        assert (result.lost, result.duplicated) == (0, 0), result
    assert "refused up front" in poison.detail and "quarantined whole" in poison.detail
    # The first may fit in the slack of the spool file's last page; never all of them.
    assert re.search(r"disk filled, [1-9] of 3 rollouts refused meanwhile", disk.tried), disk.tried
    assert not any(line.startswith("tmpfs") and str(tmp_path) in line
                   for line in Path("/proc/mounts").read_text().splitlines()), "the tmpfs was left mounted"
