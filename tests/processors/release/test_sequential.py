"""The always-valid confidence sequence: its formula, its coverage under continuous monitoring, its edges."""

from __future__ import annotations

import math

import numpy as np
import pytest

from processors.release.sequential import (
    difference_interval,
    log_mixture_ratio,
    mean_interval,
    mixture_radius,
    rate_interval,
    sample_variance,
)


def test_radius_is_where_the_mixture_ratio_reaches_one_over_alpha() -> None:
    # The interval is the set of theta0 the mSPRT does not reject: at its ends, Lambda = 1/alpha exactly.
    for variance in (1e-4, 3e-3, 0.2):
        for alpha, tau in ((0.05, 0.05), (0.01, 0.3)):
            r = float(mixture_radius(variance, alpha, tau))
            assert math.isclose(float(log_mixture_ratio(r, variance, tau)), math.log(1 / alpha), rel_tol=1e-9)
            assert float(log_mixture_ratio(0.5 * r, variance, tau)) < math.log(1 / alpha)


def test_coverage_holds_at_every_look_simultaneously() -> None:
    """Gaussian streams with unequal, changing allocation, looked at after every observation: the share of
    streams whose interval ever misses the true difference stays below alpha; a fixed-sample 95% interval
    looked at as often misses far more often."""
    rng = np.random.default_rng(7)
    streams, looks, alpha, theta = 2000, 400, 0.05, 0.3
    # Allocation ramps: the candidate gets 10% of each batch of 10 first, then half.
    n_b_step = np.where(np.arange(looks) < 200, 1, 5)
    n_a_step = 10 - n_b_step
    sum_a = np.cumsum(rng.normal(0.0, 1.0, (streams, looks)) * np.sqrt(n_a_step), axis=1)
    sum_b = np.cumsum(rng.normal(theta * n_b_step, 2.0 * np.sqrt(n_b_step), (streams, looks)), axis=1)
    n_a, n_b = np.cumsum(n_a_step), np.cumsum(n_b_step)
    iv = difference_interval(n_a, sum_a, 1.0, n_b, sum_b, 4.0, alpha=alpha, tau=0.2)
    ever_missed = ((iv.low > theta) | (iv.high < theta)).any(axis=1)
    assert ever_missed.mean() <= alpha
    z = 1.959964 * np.sqrt(iv.variance)
    naive_missed = ((iv.estimate - z > theta) | (iv.estimate + z < theta)).any(axis=1)
    assert naive_missed.mean() > 3 * alpha  # why an always-valid sequence is needed at all


def test_interval_narrows_and_centres_on_the_estimate() -> None:
    wide = mean_interval(50, 25.0, 25.0, 50, 30.0, 30.0, alpha=0.05, tau=0.05)
    narrow = mean_interval(5000, 2500.0, 2500.0, 5000, 3000.0, 3000.0, alpha=0.05, tau=0.05)
    assert float(wide.estimate) == pytest.approx(0.1) == float(narrow.estimate)
    assert float(narrow.high - narrow.low) < float(wide.high - wide.low)
    assert float(narrow.low) > 0 > float(wide.low)


def test_no_observation_gives_an_unbounded_interval() -> None:
    iv = mean_interval(0, 0.0, 0.0, 10, 5.0, 5.0, alpha=0.05, tau=0.1)
    assert float(iv.low) == -math.inf and float(iv.high) == math.inf
    # All rewards equal on both arms: zero variance, floored to a positive width.
    flat = mean_interval(100, 100.0, 100.0, 100, 100.0, 100.0, alpha=0.05, tau=0.1, variance_floor=1e-4)
    assert float(flat.low) < 0 < float(flat.high)


def test_sample_variance_matches_numpy() -> None:
    x = np.random.default_rng(3).normal(2.0, 1.5, 37)
    assert float(sample_variance(x.size, x.sum(), (x * x).sum())) == pytest.approx(np.var(x, ddof=1))
    assert float(sample_variance(1, 3.0, 9.0)) == 0.0


def test_rate_interval_sees_a_higher_error_rate() -> None:
    iv = rate_interval(2000, 20, 2000, 200, alpha=0.025, tau=0.02)
    assert float(iv.estimate) == pytest.approx(0.09)
    assert float(iv.low) > 0.05
    none_yet = rate_interval(200, 0, 200, 0, alpha=0.025, tau=0.02)
    assert float(none_yet.low) < 0 < float(none_yet.high)  # no error on either side is not zero variance


@pytest.mark.parametrize(("alpha", "tau"), [(0.0, 0.1), (1.0, 0.1), (0.05, 0.0)])
def test_invalid_levels_are_refused(alpha: float, tau: float) -> None:
    with pytest.raises(ValueError, match="must"):
        mixture_radius(0.01, alpha, tau)
