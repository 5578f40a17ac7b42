"""How a step that reached its deadline undecided ends (pure functions, no I/O).

Three endings, never confused: ``no_traffic`` (an arm got no answer at all during the step:
nothing was measured), ``inconclusive`` (answers came, but the CTR test's confidence
sequence still straddles its bounds, or the guardrails lack their minimum requests: the
ending reports the interval reached and about how long the decision would have needed at
this traffic and this difference), and guardrail failures, which end a rollout at once and
never reach the deadline. What an inconclusive step does is the plan's setting
(``RolloutPlan.on_inconclusive``): stay on production (the default), or promote a candidate
a final fixed-horizon test shows non-inferior (``non_inferior``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

from control.rollout.analysis import AnalysisConfig, ArmStats, always_valid_ctr
from control.rollout.sequential import smoothed, variance_to_decide

Ending = Literal["no_traffic", "inconclusive"]


@dataclass(frozen=True)
class Horizon:
    """What an undecided step had measured when its deadline came."""

    ending: Ending
    detail: str
    interval: tuple[float, float] | None = None
    """The CTR difference's confidence sequence (canary - production), when measured."""
    margin: float | None = None
    """The absolute CTR difference the lower bound had to exceed to pass."""
    needed_factor: float | None = None
    """How many times the data so far the decision would have needed (None: no amount at
    the observed difference; the observed difference is assumed to hold)."""
    needed_s: float | None = None
    """``needed_factor`` times the time the data took: the rollout's time to a decision."""
    non_inferior: bool = False
    """A final fixed-horizon test: the one-sided (1 - alpha) lower bound of the difference is
    above the margin, and the guardrails judged with no breach."""


def sample_factor(control: ArmStats, canary: ArmStats, config: AnalysisConfig) -> float | None:
    """How many times the current samples both tests need to decide, assuming the observed
    CTR difference and traffic mix hold: the CTR test needs its confidence sequence clear
    of the margin (pass) or of 0 (fail) and ``min_impressions``; the guardrails need
    ``min_requests`` per arm. None when the CTR difference sits exactly where no amount of
    data decides (at the margin with a margin of 0)."""
    factors = [1.0]
    least_requests = min(control.requests, canary.requests)
    if least_requests <= 0:
        return None
    factors.append(config.min_requests / least_requests)
    least_impressions = min(control.impressions, canary.impressions)
    if least_impressions <= 0:
        return None
    factors.append(config.min_impressions / least_impressions)
    tau = config.mixture_tau * smoothed(control.clicks, control.impressions)
    ctr = always_valid_ctr(control, canary, tau, config.alpha, config.cuped, config.cuped_theta)
    difference, variance, base = ctr["difference"], ctr["variance"], ctr["rate_control"]
    if difference is None or variance is None or base is None:
        return None
    margin = -config.non_inferiority_margin * float(base)
    lower = ctr["cs_lower"]
    if lower is not None and float(lower) > margin:
        return max(factors)
    allowed = []
    if float(difference) > margin:
        allowed.append(variance_to_decide(float(difference) - margin, tau, config.alpha))
    if float(difference) < 0.0:
        allowed.append(variance_to_decide(-float(difference), tau, config.alpha))
    if not allowed:
        return None
    factors.append(float(variance) / max(allowed))
    return max(factors)


def at_horizon(
    control: ArmStats,
    canary: ArmStats,
    step_requests: tuple[int, int],
    config: AnalysisConfig,
    measured_s: float,
) -> Horizon:
    """The ending of a step that reached its deadline undecided. ``step_requests``: the
    (production, canary) answers during this step; ``measured_s``: how long the counts
    took to gather (their start to now)."""
    if min(step_requests) <= 0:
        which = "production" if step_requests[0] <= 0 else "the canary"
        return Horizon("no_traffic", f"{which} got no answer during the step")
    tau = config.mixture_tau * smoothed(control.clicks, control.impressions)
    ctr = always_valid_ctr(control, canary, tau, config.alpha, config.cuped, config.cuped_theta)
    lower, upper, base = ctr["cs_lower"], ctr["cs_upper"], ctr["rate_control"]
    interval = None if lower is None or upper is None else (float(lower), float(upper))
    margin = None if base is None else -config.non_inferiority_margin * float(base)
    factor = sample_factor(control, canary, config)
    needed_s = None if factor is None else factor * measured_s
    judged = min(control.requests, canary.requests) >= config.min_requests
    non_inferior = False
    if interval is not None and margin is not None and ctr["variance"] is not None:
        z = NormalDist().inv_cdf(1.0 - config.alpha)
        fixed_lower = float(ctr["difference"] or 0.0) - z * math.sqrt(float(ctr["variance"]))
        non_inferior = judged and fixed_lower > margin
    parts = []
    if interval is not None and margin is not None:
        parts.append(
            f"CTR difference {float(ctr['difference'] or 0.0):.4g}, "
            f"{1 - config.alpha:.0%} confidence sequence [{interval[0]:.4g}, {interval[1]:.4g}]"
            f" after {measured_s:.0f} s; passing needs the lower bound above {margin:.4g}, "
            "failing the upper below 0"
        )
    else:
        parts.append(f"fewer than {config.min_impressions} impressions per arm")
    if not judged:
        parts.append(f"guardrails short of {config.min_requests} requests per arm")
    parts.append(
        f"a decision would take about {needed_s:.0f} s at this traffic and difference"
        if needed_s is not None
        else "no amount of traffic decides at this difference"
    )
    detail = "; ".join(parts)
    return Horizon("inconclusive", detail, interval, margin, factor, needed_s, non_inferior)
