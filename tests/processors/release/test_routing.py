"""Sticky routing: a session moves at most once during a ramp, shares match fractions, pins win."""

from __future__ import annotations

import numpy as np
import pytest

from processors.release.routing import route, session_point

SESSIONS = [f"session-{i}" for i in range(20_000)]
RAMP = (0.05, 0.25, 0.5, 1.0)


def _versions(release_id: str, fraction: float, candidate: int | None = 8) -> np.ndarray:
    return np.array([route(s, release_id=release_id, serving_version=7, candidate_version=candidate,
                           candidate_fraction=fraction) for s in SESSIONS])


def test_a_session_stays_on_the_candidate_as_the_ramp_goes_up() -> None:
    by_stage = np.stack([_versions("rel-a", f) for f in RAMP])  # stage x session
    on_candidate = by_stage == 8
    # Once on the candidate, on it at every later stage; so each session switches at most once.
    assert (on_candidate[1:] >= on_candidate[:-1]).all()
    switches = (by_stage[1:] != by_stage[:-1]).sum(axis=0)
    assert switches.max() == 1
    assert (by_stage[-1] == 8).all()


@pytest.mark.parametrize("fraction", [0.05, 0.25, 0.5])
def test_the_candidate_share_is_the_fraction(fraction: float) -> None:
    share = float(np.mean(_versions("rel-a", fraction) == 8))
    assert abs(share - fraction) < 4 * np.sqrt(fraction * (1 - fraction) / len(SESSIONS))


def test_routing_is_deterministic_and_each_release_has_its_own_cohort() -> None:
    first = _versions("rel-a", 0.25)
    assert (first == _versions("rel-a", 0.25)).all()
    other = _versions("rel-b", 0.25)
    overlap = float(np.mean((first == 8) & (other == 8)))
    assert abs(overlap - 0.25 * 0.25) < 0.02  # independent, not the same quarter of users again
    assert session_point("rel-a", "s") == session_point("rel-a", "s")
    assert 0.0 <= session_point("rel-a", "s") < 1.0


def test_no_candidate_serves_everyone_the_serving_version_and_pins_win() -> None:
    assert set(_versions("rel-a", 0.5, candidate=None)) == {7}
    assert set(_versions("rel-a", 0.0)) == {7}
    pins = {"eval": 3}
    assert route("s", release_id="r", serving_version=7, candidate_version=8, candidate_fraction=1.0,
                 pinned=pins, label="eval") == 3
    assert route("s", release_id="r", serving_version=7, candidate_version=8, candidate_fraction=1.0,
                 pinned=pins, label="other") == 8
