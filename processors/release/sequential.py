"""Always-valid confidence sequences for a difference of two means (normal-mixture SPRT), numpy only.

The release controller looks at the comparison after every observation, so a fixed-sample test would
reject a true null far more often than its level says. This module uses the mixture sequential
probability ratio test (mSPRT) of Robbins (1970), as used for A/B tests by Johari, Pekelis and Walsh
("Always valid inference", 2017), inverted into a confidence sequence.

Setting. Arm ``a`` (serving) and arm ``b`` (candidate) produce observations with means ``mu_a``, ``mu_b``
and variances ``s_a^2``, ``s_b^2``. After ``n_a`` and ``n_b`` of them the estimate of
``theta = mu_b - mu_a`` is ``d = mean_b - mean_a`` with variance ``V = s_a^2 / n_a + s_b^2 / n_b``.
With information ``I = 1 / V``, ``Z = d * I`` is (for Gaussian data) a Brownian motion with drift
``theta`` in information time, whatever the allocation between the arms and however it changes, as long
as the allocation depends only on the past (a ramp decided from earlier data qualifies):
``Cov(Z_1, Z_2) = I_1`` for ``I_1 <= I_2``.

Mixing the likelihood ratio ``exp(t Z - t^2 I / 2)`` of ``theta = t`` against ``theta = theta0`` over a
prior ``t ~ N(theta0, tau^2)`` gives the mixture ratio::

    Lambda = sqrt(V / (V + tau^2)) * exp( (d - theta0)^2 * tau^2 / (2 V (V + tau^2)) )

a nonnegative martingale with mean 1 under ``theta = theta0``. By Ville's inequality
``P(sup_n Lambda_n >= 1 / alpha) <= alpha``: rejecting when ``Lambda >= 1/alpha`` is valid however often
and whenever one looks. Inverting, the set of ``theta0`` not rejected is the interval ``d +- r`` with::

    r = sqrt( V (V + tau^2) / tau^2 * (2 log(1 / alpha) + log((V + tau^2) / V)) )

which covers ``theta`` at every n simultaneously with probability at least ``1 - alpha``.

One-sided use. The controller acts on one end of an interval (promote when the lower end clears a
margin, roll back when the upper end falls below one). Each such event is contained in the event that
the interval misses theta, so its probability is at most ``alpha`` too. When the true difference drifts
(it is <= 0 at every time rather than = 0) the probability of a lower end above 0 only shrinks: Z's path
is pointwise lower than under theta = 0 and the crossing event is monotone in the path.

Approximations, stated: the variances are estimated (plug-in sample variances, floored by
``variance_floor``), and rewards are not Gaussian. With a minimum number of observations per arm before
any decision (the plan's guard rail) the normal approximation and the plug-in are accurate; the
simulation test (tests/processors/release/test_simulation.py) checks the error rates on Bernoulli rewards.

``tau`` sets where the sequence is tightest: near ``V ~ tau^2`` (the effect size ``tau`` is detected
soonest). Every function takes numpy arrays (or scalars) and broadcasts, so a simulation can evaluate
thousands of streams at once with the same code the controller runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
ArrayLike = float | int | npt.NDArray[np.float64] | npt.NDArray[np.int64]


@dataclass(frozen=True)
class Interval:
    """An always-valid confidence interval for ``mean_b - mean_a`` (arrays broadcast like the inputs).

    ``low``/``high`` are ``-inf``/``+inf`` where an arm has no observation yet."""

    estimate: FloatArray
    low: FloatArray
    high: FloatArray
    variance: FloatArray  # V, the variance of the estimate


def sample_variance(n: ArrayLike, total: ArrayLike, total_sq: ArrayLike) -> FloatArray:
    """Unbiased sample variance from the count, sum and sum of squares (0 where n < 2)."""
    n_ = np.asarray(n, dtype=np.float64)
    s = np.asarray(total, dtype=np.float64)
    q = np.asarray(total_sq, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = (q - s * s / n_) / (n_ - 1.0)
    # Rounding can make a tiny negative out of a zero variance.
    return np.where(n_ >= 2, np.maximum(var, 0.0), 0.0)


def mixture_radius(variance: ArrayLike, alpha: float, tau: float) -> FloatArray:
    """``r`` above: half the width of the level-``alpha`` mixture confidence sequence at variance V."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if tau <= 0.0:
        raise ValueError(f"tau must be positive, got {tau}")
    v = np.asarray(variance, dtype=np.float64)
    t2 = tau * tau
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = v * (v + t2) / t2 * (2.0 * np.log(1.0 / alpha) + np.log((v + t2) / v))
    return np.where(np.isfinite(v) & (v > 0), np.sqrt(r2), np.inf)


def log_mixture_ratio(estimate: ArrayLike, variance: ArrayLike, tau: float, theta0: float = 0.0) -> FloatArray:
    """``log Lambda`` above: the evidence against ``theta = theta0`` (reject at ``>= log(1/alpha)``)."""
    d = np.asarray(estimate, dtype=np.float64) - theta0
    v = np.asarray(variance, dtype=np.float64)
    t2 = tau * tau
    return 0.5 * np.log(v / (v + t2)) + d * d * t2 / (2.0 * v * (v + t2))


def difference_interval(
    n_a: ArrayLike, total_a: ArrayLike, var_a: ArrayLike,
    n_b: ArrayLike, total_b: ArrayLike, var_b: ArrayLike,
    *, alpha: float, tau: float, variance_floor: float = 0.0,
) -> Interval:
    """The level-``alpha`` confidence sequence for ``mean_b - mean_a`` from each arm's count, sum and
    (estimated) variance; each arm's variance is raised to ``variance_floor`` first, so two arms whose
    observations happen to be all equal still get an interval of positive width."""
    na = np.asarray(n_a, dtype=np.float64)
    nb = np.asarray(n_b, dtype=np.float64)
    va = np.maximum(np.asarray(var_a, dtype=np.float64), variance_floor)
    vb = np.maximum(np.asarray(var_b, dtype=np.float64), variance_floor)
    seen = (na > 0) & (nb > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = np.where(seen, np.asarray(total_b, dtype=np.float64) / nb
                            - np.asarray(total_a, dtype=np.float64) / na, 0.0)
        variance = np.where(seen, va / na + vb / nb, np.inf)
    radius = mixture_radius(variance, alpha, tau)
    return Interval(estimate, estimate - radius, estimate + radius, variance)


def mean_interval(
    n_a: ArrayLike, total_a: ArrayLike, total_sq_a: ArrayLike,
    n_b: ArrayLike, total_b: ArrayLike, total_sq_b: ArrayLike,
    *, alpha: float, tau: float, variance_floor: float = 0.0,
) -> Interval:
    """``difference_interval`` with each arm's variance estimated from its sum of squares."""
    return difference_interval(
        n_a, total_a, sample_variance(n_a, total_a, total_sq_a),
        n_b, total_b, sample_variance(n_b, total_b, total_sq_b),
        alpha=alpha, tau=tau, variance_floor=variance_floor,
    )


def rate_interval(
    n_a: ArrayLike, events_a: ArrayLike, n_b: ArrayLike, events_b: ArrayLike, *, alpha: float, tau: float,
) -> Interval:
    """The confidence sequence for the difference of two event rates (errors per call).

    Each arm's Bernoulli variance uses a shrunk rate ``(events + 1/2) / (n + 1)``, so an arm with no
    event (or only events) yet does not claim zero variance."""
    na = np.asarray(n_a, dtype=np.float64)
    nb = np.asarray(n_b, dtype=np.float64)
    pa = (np.asarray(events_a, dtype=np.float64) + 0.5) / (na + 1.0)
    pb = (np.asarray(events_b, dtype=np.float64) + 0.5) / (nb + 1.0)
    return difference_interval(na, events_a, pa * (1 - pa), nb, events_b, pb * (1 - pb), alpha=alpha, tau=tau)
