"""What ``tokentrail demo`` prints last: reward bands, a plain note when the reward did not rise."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from demo.progress import VersionStats
from demo.run import _summarize, _workload_defaults, version_bands

pytestmark = pytest.mark.e2e


def _versions(rewards: list[float]) -> dict[int, VersionStats]:
    return {v: VersionStats(rewards=[r]) for v, r in enumerate(rewards, start=1)}


def test_bands_average_equal_slices_of_versions() -> None:
    bands = version_bands(_versions([0.0, 0.5, 1.0, 1.0]), bands=2)
    assert bands == [(1, 2, 0.25, 2), (3, 4, 1.0, 2)]


def test_a_last_slice_of_one_version_joins_the_band_before_it() -> None:
    # 21 versions in 5 bands of 5: the 21st alone would be the last band that reward_improved compares.
    bands = version_bands(_versions([0.5] * 20 + [0.0]), bands=5)
    assert [(first, last) for first, last, _, _ in bands] == [(1, 5), (6, 10), (11, 15), (16, 21)]
    assert bands[-1][2:] == (2.5 / 6, 6)
    # A last slice of at least half a band stays a band of its own.
    assert len(version_bands(_versions([0.5] * 23), bands=5)) == 5


@pytest.mark.parametrize(("rewards", "improved"), [([0.1, 0.2, 0.8, 0.9], True), ([0.8, 0.9, 0.1, 0.0], False)])
def test_summary_says_whether_reward_rose(rewards: list[float], improved: bool, capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    rc = _summarize(_versions(rewards), audit_rc=0, report_path=tmp_path / "report.html")
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and summary["audit_passed"]
    assert summary["reward_improved"] is improved
    assert ("the reward did not rise" in out) is not improved


def test_failed_audit_fails_the_job(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _summarize(_versions([0.1, 0.9]), audit_rc=1, report_path=tmp_path / "r.html") == 1
    assert "audit: FAILED" in capsys.readouterr().out


def test_the_workload_defaults_follow_the_engine_and_explicit_values_win() -> None:
    def resolved(**given: object) -> tuple[int, int]:
        args = argparse.Namespace(**{"group_size": None, "concurrency": None, "release": False,
                                     "production": False, "upstream": "embedded", **given})
        _workload_defaults(args)
        return args.group_size, args.concurrency

    assert resolved() == (8, 2)
    assert resolved(upstream="vllm") == (4, 4)
    assert resolved(upstream="vllm", release=True) == (8, 2)  # the release demo keeps its sessions
    assert resolved(upstream="vllm", group_size=6, concurrency=1) == (6, 1)
