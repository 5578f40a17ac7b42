"""The two sequential tests the canary analysis repeats at every look (pure functions):
normal-mixture SPRTs for the canary's share of requests (the sample-ratio test) and for a
difference of two rates.
``control.rollout.analysis`` documents the statistics and how the verdict uses them."""

from __future__ import annotations

import math

from core.errors import ConfigError

PSEUDO_COUNT = 0.5  # per arm, in the variance only (see control.rollout.analysis)
Value = float | int | None


def srm_test(
    control_requests: int,
    canary_requests: int,
    canary_weight: float,
    variance: float | None = None,
    tau: float | None = None,
    heaviest: float = 0.0,
) -> tuple[float, float]:
    """The observed split against ``canary_weight``: (chi2, p).

    ``chi2 = (canary - expected)^2 / v`` with ``v`` the larger of the binomial variance
    ``total * w * (1 - w)`` (Pearson's statistic for two cells) and ``variance``, the
    variance of ``canary - expected`` measured between user clusters: users are assigned,
    so heavy users make the request split noisier than independent requests.

    Without ``tau``, ``p`` is the one-look chi-square p (1 df). With ``tau``, it is the
    always-valid p of a normal-mixture SPRT on the canary's share of requests (prior sd of
    its deviation from ``w``: ``tau * sqrt(w * (1 - w))``), ``min(1, 1 / LR)``: rejecting
    whenever it falls below alpha keeps the false-halt rate under alpha however many looks
    judge the growing counts (the one-look p, repeated every interval, does not: about 1 %
    of healthy rollouts over 40 looks at p < 0.001, and more the more looks).

    ``heaviest``: the most requests one user made (or an upper bound). A deviation toward
    the smaller share's excess then gets Bernstein's allowance for a sum of few large terms;
    a shortfall of the smaller arm (what a broken split usually shows) keeps the normal test,
    whose lower tail is the lighter one for such sums."""
    if not 0.0 < canary_weight < 1.0:
        raise ConfigError(f"canary_weight must lie in (0, 1), got {canary_weight}")
    total = control_requests + canary_requests
    if total <= 0:
        return 0.0, 1.0
    expected_canary = total * canary_weight
    binomial = total * canary_weight * (1.0 - canary_weight)
    spread = max(binomial, variance or 0.0)
    deviation = canary_requests - expected_canary
    if heaviest > 0.0 and deviation * (0.5 - canary_weight) > 0.0:
        # the smaller arm's count is a sum over few users, skewed toward excess: a heavy user
        # drawn into it moves it by ``heaviest`` at once, which the normal tail understates;
        # Bernstein's inequality allows for it with ``heaviest * |deviation| / 3`` more
        spread += heaviest * abs(deviation) / 3.0
    chi2 = deviation**2 / spread
    if tau is None:
        return chi2, math.erfc(math.sqrt(chi2 / 2.0))
    # the share's deviation theta, its variance s2 and the mixture's prior variance t2
    s2 = spread / (total * total)
    t2 = (tau * tau) * canary_weight * (1.0 - canary_weight)
    log_lr = 0.5 * math.log(s2 / (s2 + t2)) + chi2 * t2 / (2.0 * (s2 + t2))
    return chi2, min(1.0, math.exp(-log_lr))


def mixture_test(
    x_control: int,
    n_control: int,
    x_canary: int,
    n_canary: int,
    tau: float,
    alpha: float,
    variances: tuple[float | None, float | None] = (None, None),
) -> dict[str, Value]:
    """Normal-mixture SPRT of one look for the difference of two proportions (canary - control).

    ``variances``: per arm, a variance of the rate estimate measured between clusters of
    users; each arm uses the larger of it and the binomial one (clustered data are rarely
    less variable than independent trials, and a small number of clusters can understate it).

    Returns the rates, difference, variance, tau, log and plain mixture likelihood ratio, this
    look's always-valid p and the confidence sequence; rates and bounds are None for an empty arm.
    """
    out: dict[str, Value] = {
        "n_control": n_control,
        "n_canary": n_canary,
        "rate_control": None,
        "rate_canary": None,
        "difference": None,
        "variance": None,
        "tau": tau,
        "log_likelihood_ratio": 0.0,
        "likelihood_ratio": 1.0,
        "p_value": 1.0,
        "cs_lower": None,
        "cs_upper": None,
    }
    if n_control <= 0 or n_canary <= 0:
        return out
    x1, x2 = min(x_control, n_control), min(x_canary, n_canary)
    q1 = (x1 + PSEUDO_COUNT) / (n_control + 2 * PSEUDO_COUNT)
    q2 = (x2 + PSEUDO_COUNT) / (n_canary + 2 * PSEUDO_COUNT)
    v1, v2 = variances
    s2 = max(q1 * (1.0 - q1) / n_control, v1 or 0.0) + max(q2 * (1.0 - q2) / n_canary, v2 or 0.0)
    t2 = tau * tau
    theta = x2 / n_canary - x1 / n_control
    log_lr = 0.5 * math.log(s2 / (s2 + t2)) + t2 * theta * theta / (2.0 * s2 * (s2 + t2))
    half = half_width(s2, tau, alpha)
    out.update(
        rate_control=x1 / n_control,
        rate_canary=x2 / n_canary,
        difference=theta,
        variance=s2,
        log_likelihood_ratio=log_lr,
        likelihood_ratio=math.exp(min(log_lr, 700.0)),  # stays a finite JSON number
        p_value=min(1.0, math.exp(-log_lr)),
        cs_lower=theta - half,
        cs_upper=theta + half,
    )
    return out


def smoothed(successes: int, trials: int) -> float:
    """The rate with the half pseudo-count, positive even with no successes or trials."""
    return (min(successes, trials) + PSEUDO_COUNT) / (max(trials, 0) + 2 * PSEUDO_COUNT)


def half_width(variance: float, tau: float, alpha: float) -> float:
    """Half-width of the mixture's confidence sequence when the difference's estimate has
    ``variance`` (it grows with the variance: more data, narrower)."""
    t2 = tau * tau
    return math.sqrt(
        variance
        * (variance + t2)
        / t2
        * (math.log((variance + t2) / variance) + 2.0 * math.log(1.0 / alpha))
    )


def variance_to_decide(distance: float, tau: float, alpha: float) -> float:
    """The largest variance of the difference's estimate at which the confidence sequence's
    half-width is at most ``distance``: with the estimate ``distance`` away from a bound,
    the test decides once the variance falls below it (it falls as 1 / samples)."""
    if distance <= 0.0 or tau <= 0.0:
        raise ConfigError(f"distance and tau must be positive, got {distance}, {tau}")
    low, high = 0.0, max(distance * distance, tau * tau)
    while half_width(high, tau, alpha) < distance:  # widen until it brackets
        high *= 4.0
    for _ in range(100):  # bisection on a monotone function; 1e-30 relative is plenty
        middle = 0.5 * (low + high)
        if middle <= 0.0 or half_width(middle, tau, alpha) > distance:
            high = middle
        else:
            low = middle
    return low
