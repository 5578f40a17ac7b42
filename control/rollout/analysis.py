"""Canary analysis: one verdict per analysis interval, canary against the concurrently served
production version, from cumulative per-arm counts (pure functions, no I/O).

The checks, the first that decides wins: sample-ratio mismatch (``halt``), guardrails
(``fail``), then the CTR test (``fail`` / ``pass`` / ``hold``), each with an always-valid
sequential test so that looking at every interval keeps its error rate. The statistics, and
why each choice was made: docs/continuous-training.md, "The rollout's analysis".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from control.rollout.cuped import CupedArm, cuped_difference, mixture_on_estimate
from control.rollout.sequential import mixture_test, smoothed, srm_test
from core.errors import ConfigError

Outcome = Literal["pass", "fail", "hold", "halt"]
Reason = Literal[
    "kpi_pass", "kpi_worse", "error_rate", "degraded_rate", "latency", "srm", "insufficient_data"
]
Value = float | int | None

SLOW_SHARE_TAU = 0.01  # mixing sd of the slow-request share test: production's share is 1 %
SRM_MIN_EXPECTED = 5.0  # expected requests per arm before the chi-square test judges


@dataclass(frozen=True)
class ArmStats:
    """Cumulative counts of one arm (production or canary) since the step began."""

    requests: int
    errors: int
    degraded: int
    impressions: int
    clicks: int
    hits: int
    p99_ms: float | None = None
    ctr_variance: float | None = None
    """Variance of the arm's CTR estimate between user clusters (None: impressions treated
    as independent trials)."""
    hit_rate_variance: float | None = None
    """Likewise for the hit rate (hits / requests)."""
    latency_buckets: tuple[int, ...] | None = None
    """Request counts per latency bucket (shared bounds for both arms): the latency guardrail
    tests the canary's share of requests slower than production's p99 with them."""
    cuped: CupedArm | None = None
    """Per user cluster: rollout clicks and items shown, and the pre-rollout ones of the
    users served (``control.rollout.cuped``); None: no covariate, the CTR test is unadjusted."""

    def __post_init__(self) -> None:
        counts = (self.requests, self.errors, self.degraded, self.impressions, self.clicks)
        if min(*counts, self.hits) < 0:
            raise ValueError(f"negative count in {self}")


@dataclass(frozen=True)
class AnalysisConfig:
    """Thresholds and test parameters of the canary analysis (defaults documented per field)."""

    alpha: float = 0.05
    """Error rate of the sequential CTR test and the guardrail rate tests, over all looks."""
    mixture_tau: float = 0.1
    """Prior sd of the CTR difference, relative to production's CTR (10 %: the size of the
    effects a ranking change makes, so the bound is tightest where verdicts are taken)."""
    non_inferiority_margin: float = 0.05
    """Relative: the canary passes when its CTR is shown to be at most 5 % below production's."""
    min_impressions: int = 1000
    """Per arm before a KPI verdict (about 50 clicks at 5 % CTR: the normal approximation holds)."""
    min_requests: int = 1000
    """Per arm before guardrails judge (a p99 of 1000 requests rests on its 10 slowest)."""
    max_error_rate_increase: float = 0.01
    """Absolute: canary error rate may exceed production's by at most one point."""
    max_degraded_rate_increase: float = 0.02
    """Absolute: degraded answers (fallbacks) are cheaper than errors, so two points."""
    max_p99_ratio: float = 1.5
    """Canary p99 latency may be at most 1.5 times production's."""
    max_p99_increase_ms: float = 25.0
    """...and by at least this many milliseconds: a 2 ms against 1 ms p99 is no breach, and a
    p99 of a few hundred requests on a busy machine moves by tens of ms on its own."""
    cuped: bool = True
    """Adjust the CTR difference by the users' pre-rollout CTR (CUPED) when the arms carry
    it (without pre-period events nothing is adjusted). On with ``cuped_theta`` 1 since A/A
    rollouts held the level (docs/benchmarks/rollout_decision.md)."""
    cuped_pre_period_s: float = 86_400.0
    """How far before the rollout's start the covariate's events are read (a day)."""
    cuped_theta: float | None = 1.0
    """A number: fixed (1 adjusts by the whole pre-period difference); None: ``theta`` fitted
    pooled over both arms' user clusters at each look (anti-conservative on few users: see
    the benchmark note)."""
    srm_alpha: float = 0.01
    """Level of the sample-ratio test over all looks of a rollout (always valid)."""
    srm_tau: float = 0.075
    """Prior sd of the canary share's deviation from its weight ``w``, in units of
    ``sqrt(w (1 - w))`` (0.03 at w = 0.2, 0.0375 at 0.5): mismatches of that size are found
    soonest; the size routing faults make (a replica stuck on production, a lost share)."""

    def __post_init__(self) -> None:
        for name in ("alpha", "srm_alpha"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must lie in (0, 1), got {getattr(self, name)}")
        for name in (
            "mixture_tau",
            "srm_tau",
            "max_error_rate_increase",
            "max_degraded_rate_increase",
        ):
            if getattr(self, name) <= 0.0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.non_inferiority_margin < 1.0:
            raise ConfigError(
                f"non_inferiority_margin must lie in [0, 1), got {self.non_inferiority_margin}"
            )
        if self.max_p99_ratio <= 1.0:
            raise ConfigError(f"max_p99_ratio must exceed 1, got {self.max_p99_ratio}")
        if self.max_p99_increase_ms < 0.0:
            raise ConfigError(f"max_p99_increase_ms must be >= 0, got {self.max_p99_increase_ms}")
        if self.cuped_pre_period_s <= 0.0:
            raise ConfigError(f"cuped_pre_period_s must be positive, got {self.cuped_pre_period_s}")
        if self.min_impressions < 1 or self.min_requests < 1:
            raise ConfigError("min_impressions and min_requests must be at least 1")


@dataclass(frozen=True)
class Check:
    """One judged quantity; ``passed`` is None while there is not enough data to judge it."""

    name: str
    value: float | None
    threshold: float | None
    passed: bool | None
    detail: str


@dataclass(frozen=True)
class Decision:
    """The verdict of one look; ``values`` holds every number behind it (JSON-serialisable)."""

    outcome: Outcome
    reason: Reason
    checks: list[Check]
    values: dict[str, Value] = field(default_factory=dict)


@dataclass(frozen=True)
class SequentialState:
    """Carried between looks of one step: always-valid p-values only ever go down."""

    running_min_p: float = 1.0
    running_min_p_hit_rate: float = 1.0
    looks: int = 0


def always_valid_ctr(
    control: ArmStats,
    canary: ArmStats,
    tau: float,
    alpha: float,
    cuped: bool = False,
    theta: float | None = None,
) -> dict[str, Value]:
    """The mixture SPRT of one look on CTR (clicks / impressions), ``tau`` in absolute CTR.

    With ``cuped`` and both arms' covariate, on the CUPED-adjusted difference, its variance
    no lower than the binomial one per arm (the covariate explains users, not the coin flips
    of their clicks); ``cuped_*`` values say what the adjustment did (theta None: unadjusted)."""
    test = mixture_test(
        control.clicks,
        control.impressions,
        canary.clicks,
        canary.impressions,
        tau,
        alpha,
        (control.ctr_variance, canary.ctr_variance),
    )
    test.update(cuped_theta=None, cuped_variance_reduction=None, cuped_raw_difference=None)
    if not cuped or control.cuped is None or canary.cuped is None or test["difference"] is None:
        return test
    estimate = cuped_difference(control.cuped, canary.cuped, theta)
    if estimate is None:
        return test
    binomial = sum(
        smoothed(arm.clicks, arm.impressions)
        * (1 - smoothed(arm.clicks, arm.impressions))
        / arm.impressions
        for arm in (control, canary)
    )
    test.update(
        mixture_on_estimate(estimate.difference, max(estimate.variance, binomial), tau, alpha)
    )
    test.update(
        cuped_theta=estimate.theta,
        cuped_variance_reduction=estimate.variance_reduction,
        cuped_raw_difference=estimate.raw_difference,
    )
    return test


def analyse(
    control: ArmStats,
    canary: ArmStats,
    canary_weight: float,
    config: AnalysisConfig,
    state: SequentialState,
    srm_requests: tuple[int, int] | None = None,
    srm_variance: float | None = None,
    srm_heaviest: float = 0.0,
) -> tuple[Decision, SequentialState]:
    """Judge one look: SRM halts, a guardrail breach fails, then CTR passes, fails or holds.

    ``control`` is the production arm; ``state`` is what the previous look returned.
    ``srm_requests`` (control, canary) are the requests the sample-ratio test judges when
    they differ from the arms' (only those served while ``canary_weight`` was in force),
    ``srm_variance`` the variance of their canary count and ``srm_heaviest`` the most
    requests one user made (see ``srm_test``).
    """
    values: dict[str, Value] = {"canary_weight": canary_weight, "look": state.looks + 1}
    for arm, stats in (("control", control), ("canary", canary)):
        for count in ("requests", "errors", "degraded", "impressions", "clicks", "hits"):
            values[f"{count}_{arm}"] = getattr(stats, count)
        values[f"p99_ms_{arm}"] = stats.p99_ms

    control_n, canary_n = srm_requests or (control.requests, canary.requests)
    srm = _srm_check(control_n, canary_n, canary_weight, config, values, srm_variance, srm_heaviest)
    guardrails = _guardrail_checks(control, canary, config, values)
    kpi, state = _kpi_check(control, canary, config, state, values)
    checks = [srm, *guardrails, kpi]

    outcome: Outcome
    reason: Reason
    breached = [check for check in guardrails if check.passed is False]
    if srm.passed is False:
        outcome, reason = "halt", "srm"
    elif breached:
        outcome, reason = "fail", _GUARDRAIL_REASON[breached[0].name]
    elif kpi.passed is False:
        outcome, reason = "fail", "kpi_worse"
    elif kpi.passed and all(check.passed for check in guardrails):
        outcome, reason = "pass", "kpi_pass"
    else:
        outcome, reason = "hold", "insufficient_data"
    return Decision(outcome, reason, checks, values), state


def _srm_check(
    control_requests: int,
    canary_requests: int,
    canary_weight: float,
    config: AnalysisConfig,
    values: dict[str, Value],
    variance: float | None = None,
    heaviest: float = 0.0,
) -> Check:
    chi2, p = srm_test(
        control_requests, canary_requests, canary_weight, variance, config.srm_tau, heaviest
    )
    total = control_requests + canary_requests
    values.update(srm_chi2=chi2, srm_p=p, srm_expected_canary=total * canary_weight)
    split = f"canary {canary_requests} of {total} requests, configured weight {canary_weight:g}"
    if total * min(canary_weight, 1.0 - canary_weight) < SRM_MIN_EXPECTED:
        return Check("srm", p, config.srm_alpha, None, f"{split}: too few to judge")
    detail = f"{split}: chi2 {chi2:.3g}, always-valid p {p:.3g}"
    return Check("srm", p, config.srm_alpha, p >= config.srm_alpha, detail)


def _guardrail_checks(
    control: ArmStats, canary: ArmStats, config: AnalysisConfig, values: dict[str, Value]
) -> list[Check]:
    judged = min(control.requests, canary.requests) >= config.min_requests
    checks = [
        _rate_check(
            name,
            (getattr(control, count), control.requests),
            (getattr(canary, count), canary.requests),
            limit,
            judged,
            config.alpha,
            values,
        )
        for name, count, limit in (
            ("error_rate", "errors", config.max_error_rate_increase),
            ("degraded_rate", "degraded", config.max_degraded_rate_increase),
        )
    ]
    ratio = None
    if control.p99_ms is not None and canary.p99_ms is not None and control.p99_ms > 0.0:
        ratio = canary.p99_ms / control.p99_ms
    values["p99_ratio"] = ratio
    if not judged:
        latency = Check("latency", ratio, config.max_p99_ratio, None, _FEW_REQUESTS)
    elif ratio is None:
        latency = Check("latency", None, config.max_p99_ratio, None, "no p99 reported for an arm")
    else:
        latency = _latency_check(control, canary, ratio, config, values)
    return [*checks, latency]


def _latency_check(
    control: ArmStats, canary: ArmStats, ratio: float, config: AnalysisConfig, values: dict
) -> Check:
    """p99 breach: canary / production above ``max_p99_ratio``, ``max_p99_increase_ms`` more,
    and (with histograms) the canary's share of requests slower than production's p99 shown
    to be higher by the always-valid test: a p99 of a few hundred requests moves a lot on a
    busy machine, but load that slows both arms does not raise one arm's share."""
    increase = canary.p99_ms - control.p99_ms  # type: ignore[operator]
    breached = ratio > config.max_p99_ratio and increase > config.max_p99_increase_ms
    detail = (
        f"p99 {canary.p99_ms:g} ms vs {control.p99_ms:g} ms: ratio {ratio:.3g}, "
        f"+{increase:.3g} ms (breach above x{config.max_p99_ratio:g} and "
        f"+{config.max_p99_increase_ms:g} ms"
    )
    if control.latency_buckets is not None and canary.latency_buckets is not None:
        above = _p99_bucket(control.latency_buckets) + 1
        slow = (sum(control.latency_buckets[above:]), sum(canary.latency_buckets[above:]))
        test = mixture_test(
            slow[0], control.requests, slow[1], canary.requests, SLOW_SHARE_TAU, config.alpha
        )
        lower = test["cs_lower"]
        values.update(latency_slow_share_control=test["rate_control"],
                      latency_slow_share_canary=test["rate_canary"],
                      latency_slow_share_cs_lower=lower)  # fmt: skip
        breached = breached and lower is not None and float(lower) > 0.0
        detail += f", and a higher share slower than production's p99: lower bound {lower:.3g}"
    return Check("latency", ratio, config.max_p99_ratio, not breached, detail + ")")


def _p99_bucket(buckets: tuple[int, ...]) -> int:
    """Index of the bucket holding the 99th percentile (the first bucket when empty)."""
    total, running = sum(buckets), 0
    for index, count in enumerate(buckets):
        running += count
        if running >= 0.99 * total:
            return index
    return len(buckets) - 1


def _rate_check(
    name: str,
    control: tuple[int, int],
    canary: tuple[int, int],
    limit: float,
    judged: bool,
    alpha: float,
    values: dict[str, Value],
) -> Check:
    """A rate guardrail on (events, requests) per arm: breached when the increase is above
    ``limit`` and the always-valid lower bound of the increase is above 0."""
    test = mixture_test(*control, *canary, limit, alpha)
    values.update({f"{name}_{key}": test[key] for key in _REPORTED})
    increase, lower = test["difference"], test["cs_lower"]
    if not judged or increase is None or lower is None:
        return Check(name, increase, limit, None, _FEW_REQUESTS)
    breach = increase > limit and lower > 0.0
    detail = (
        f"canary {test['rate_canary']:.4g} vs production {test['rate_control']:.4g}: increase "
        f"{increase:.4g} (max {limit:g}), always-valid lower bound {lower:.4g}"
    )
    return Check(name, increase, limit, not breach, detail)


def _kpi_check(
    control: ArmStats,
    canary: ArmStats,
    config: AnalysisConfig,
    state: SequentialState,
    values: dict[str, Value],
) -> tuple[Check, SequentialState]:
    ctr_tau = config.mixture_tau * smoothed(control.clicks, control.impressions)
    ctr = always_valid_ctr(control, canary, ctr_tau, config.alpha, config.cuped, config.cuped_theta)
    hit_tau = config.mixture_tau * smoothed(control.hits, control.requests)
    hit = mixture_test(
        control.hits,
        control.requests,
        canary.hits,
        canary.requests,
        hit_tau,
        config.alpha,
        (control.hit_rate_variance, canary.hit_rate_variance),
    )
    state = SequentialState(
        running_min_p=min(state.running_min_p, _float(ctr["p_value"])),
        running_min_p_hit_rate=min(state.running_min_p_hit_rate, _float(hit["p_value"])),
        looks=state.looks + 1,
    )
    values.update({f"ctr_{key}": ctr[key] for key in (*_REPORTED, *_CUPED)})
    values.update({f"hit_rate_{key}": hit[key] for key in _REPORTED})
    values.update(
        ctr_always_valid_p=state.running_min_p,
        hit_rate_always_valid_p=state.running_min_p_hit_rate,
    )
    lower, upper, base = ctr["cs_lower"], ctr["cs_upper"], ctr["rate_control"]
    margin = None if base is None else -config.non_inferiority_margin * base
    values["ctr_non_inferiority_bound"] = margin
    enough = min(control.impressions, canary.impressions) >= config.min_impressions
    if not enough or lower is None or upper is None or margin is None:
        detail = f"fewer than {config.min_impressions} impressions per arm"
        return Check("ctr", lower, margin, None, detail), state
    detail = (
        f"CTR canary {ctr['rate_canary']:.4g} vs production {base:.4g}: difference "
        f"{ctr['difference']:.4g}, {1 - config.alpha:.0%} confidence sequence "
        f"[{lower:.4g}, {upper:.4g}], non-inferior above {margin:.4g}"
    )
    passed = False if upper < 0.0 else (True if lower > margin else None)
    return Check("ctr", lower, margin, passed, detail), state


def _float(value: Value) -> float:
    assert value is not None
    return float(value)


_FEW_REQUESTS = "fewer than the minimum requests per arm"
_GUARDRAIL_REASON: dict[str, Reason] = {
    "error_rate": "error_rate",
    "degraded_rate": "degraded_rate",
    "latency": "latency",
}
_CUPED = ("cuped_theta", "cuped_variance_reduction", "cuped_raw_difference")
_REPORTED = (
    "rate_control", "rate_canary", "difference", "variance", "tau", "log_likelihood_ratio",
    "likelihood_ratio", "p_value", "cs_lower", "cs_upper",
)  # fmt: skip
