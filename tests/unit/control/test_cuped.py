"""CUPED for the rollout's CTR test: the adjusted estimator on simulated users, the analysis
using it only when asked and when there is a covariate, and a covariate read only from
events logged before the rollout started."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from control.rollout.analysis import AnalysisConfig, ArmStats, SequentialState, analyse
from control.rollout.controller import RolloutPlan
from control.rollout.cuped import (
    Covariates,
    CupedArm,
    cuped_difference,
    explained_share,
    read_pre_period,
)
from control.rollout.planner import Traffic, forecast
from control.rollout.state import cluster_ratio_variance
from services.stores.memory import InMemoryStore

USERS = 943


def population(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Users' own click rates (Beta(1, 19), mean 0.05) and items shown per period."""
    return rng.beta(1.0, 19.0, USERS), rng.integers(20, 400, USERS)


def arm_of(
    users: np.ndarray, rate: np.ndarray, shown: np.ndarray, rng: np.random.Generator, lift=0.0
) -> CupedArm:
    """One arm with users as units: a pre-period and a rollout period of clicks."""
    pre_clicks = rng.binomial(shown[users], rate[users])
    clicks = rng.binomial(shown[users], np.minimum(rate[users] * (1 + lift), 1.0))
    return CupedArm(tuple(clicks), tuple(shown[users]), tuple(pre_clicks), tuple(shown[users]))


def split(rng: np.random.Generator, weight: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
    canary = rng.random(USERS) < weight
    return np.flatnonzero(~canary), np.flatnonzero(canary)


def test_the_adjustment_reduces_the_variance_when_the_covariate_correlates() -> None:
    rng = np.random.default_rng(3)
    rate, shown = population(rng)
    control, canary = split(rng)
    estimate = cuped_difference(arm_of(control, rate, shown, rng), arm_of(canary, rate, shown, rng))
    assert estimate is not None
    assert estimate.theta > 0.3  # users who clicked more before click more now
    assert estimate.variance < 0.6 * estimate.raw_variance
    assert estimate.variance_reduction > 0.4


def test_on_aa_data_the_adjusted_difference_is_unbiased_and_its_variance_calibrated() -> None:
    rng = np.random.default_rng(4)
    rate, shown = population(rng)  # one fixed population, as MovieLens' 943 users
    adjusted, raw, variances = [], [], []
    for _ in range(400):
        control, canary = split(rng)
        estimate = cuped_difference(
            arm_of(control, rate, shown, rng), arm_of(canary, rate, shown, rng)
        )
        assert estimate is not None
        adjusted.append(estimate.difference)
        raw.append(estimate.raw_difference)
        variances.append(estimate.variance)
    adjusted_ = np.asarray(adjusted)
    spread = adjusted_.std()
    assert abs(adjusted_.mean()) < 3 * spread / np.sqrt(len(adjusted))  # no bias
    assert spread < 0.7 * np.std(raw)  # tighter than the unadjusted difference
    # the estimated variance matches the spread the estimates really have
    assert np.mean(variances) == pytest.approx(spread**2, rel=0.25)


def test_without_pre_period_data_nothing_is_adjusted() -> None:
    rng = np.random.default_rng(5)
    rate, shown = population(rng)
    control, canary = split(rng)
    arms = [arm_of(users, rate, shown, rng) for users in (control, canary)]
    empty = [
        CupedArm(a.clicks, a.impressions, (0,) * len(a.clicks), (0,) * len(a.clicks)) for a in arms
    ]
    assert cuped_difference(*empty) is None
    assert Covariates().arm("control", [1, 2], [10, 20]) is None  # no pre-period read


def test_users_without_a_pre_period_leave_the_estimate_no_worse() -> None:
    rng = np.random.default_rng(6)
    rate, shown = population(rng)
    control, canary = split(rng)
    arms = []
    for users in (control, canary):
        arm = arm_of(users, rate, shown, rng)
        new = rng.random(len(users)) < 0.7  # most users are new: no pre-period
        pre_clicks = np.where(new, 0, arm.pre_clicks)
        pre_shown = np.where(new, 0, arm.pre_impressions)
        arms.append(CupedArm(arm.clicks, arm.impressions, tuple(pre_clicks), tuple(pre_shown)))
    estimate = cuped_difference(*arms)
    assert estimate is not None
    assert estimate.variance <= estimate.raw_variance  # theta minimises it: never worse


def stats_of(arm: CupedArm, with_covariate: bool = True) -> ArmStats:
    clicks, shown = sum(arm.clicks), sum(arm.impressions)
    return ArmStats(
        requests=shown // 10,
        errors=0,
        degraded=0,
        impressions=shown,
        clicks=clicks,
        hits=clicks // 2,
        ctr_variance=cluster_ratio_variance(list(arm.clicks), list(arm.impressions)),
        cuped=arm if with_covariate else None,
    )


def test_the_analysis_uses_the_covariate_only_when_configured_and_present() -> None:
    rng = np.random.default_rng(7)
    rate, shown = population(rng)
    control, canary = split(rng, 0.5)
    arms = [stats_of(arm_of(users, rate, shown, rng)) for users in (control, canary)]
    values = {}
    for cuped in (False, True):
        config = AnalysisConfig(cuped=cuped, min_requests=100)
        decision, _ = analyse(*arms, 0.5, config, SequentialState())
        values[cuped] = decision.values
    assert values[False]["ctr_cuped_theta"] is None
    assert values[True]["ctr_cuped_theta"] is not None
    assert values[True]["ctr_variance"] < values[False]["ctr_variance"]
    assert values[True]["ctr_cuped_raw_difference"] == pytest.approx(
        values[False]["ctr_difference"]
    )
    # on, but an arm without the covariate: the unadjusted test, unchanged
    bare = [arms[0], stats_of(arms[1].cuped, with_covariate=False)]  # type: ignore[arg-type]
    on, _ = analyse(*bare, 0.5, AnalysisConfig(cuped=True, min_requests=100), SequentialState())
    off, _ = analyse(*bare, 0.5, AnalysisConfig(min_requests=100), SequentialState())
    assert on.values["ctr_variance"] == off.values["ctr_variance"]
    assert on.values["ctr_cuped_theta"] is None


def test_covariates_add_each_served_users_pre_period_once_per_arm() -> None:
    covariates = Covariates(pre={"1": [3, 30], "2": [1, 50]}, clusters=4)
    for user, cluster in (("1", 0), ("1", 0), ("2", 3), ("9", 3)):  # "9": new user
        covariates.see("canary", user, cluster)
    covariates.see("control", "1", 0)  # moved arms as the weight grew: counted in both
    arm = covariates.arm("canary", [1, 0, 0, 2], [10, 0, 0, 20])
    assert arm is not None
    assert arm.pre_clicks == (3, 0, 0, 1) and arm.pre_impressions == (30, 0, 0, 50)
    assert covariates.sums["control"][1][0] == 30
    again = Covariates.model_validate_json(covariates.model_dump_json())  # persisted, resumed
    again.see("canary", "1", 0)
    assert again.sums["canary"][0][0] == 3


def impression(user: str, version: str = "1") -> dict[str, str]:
    return {"request_id": "r", "user_id": user, "model_version": version, "items": "1 2 3 4"}


def click(user: str, trust: str = "served") -> dict[str, str]:
    return {"user_id": user, "item_id": "1", "type": "click", "trust": trust}


async def test_the_covariate_reads_only_vouched_events_before_the_rollouts_start() -> None:
    store = InMemoryStore()
    await store.append_impressions([impression("a"), impression("b")], 10**6, 10**6)
    await store.append_feedback([click("a"), click("a", trust="claimed")], 10**6, 10**6)
    await asyncio.sleep(0.003)
    last = (await store.read_stream("feedback"))[-1][0]
    start = f"{int(last.split('-')[0]) + 1}-0"  # the rollout starts after them
    await asyncio.sleep(0.003)
    # after the start: the canary's answers and clicks must not reach the covariate
    await store.append_impressions([impression("a", "2"), impression("c", "2")], 10**6, 10**6)
    await store.append_feedback([click("a"), click("b"), click("c")], 10**6, 10**6)
    pre = await read_pre_period(store, start, window_s=3600)
    assert pre == {"a": [1, 4], "b": [0, 4]}


def test_the_planner_uses_the_reduced_floor_with_cuped() -> None:
    # 943 users at 40 answers/s: the users' spread alone keeps 5 % steps from deciding
    traffic = Traffic(
        40.0, 10.0, 0.05, design_effect=17.8, user_variance=0.048**2, effective_users=268
    )
    plans = {
        cuped: RolloutPlan(analysis=AnalysisConfig(cuped=cuped, cuped_pre_period_s=3600))
        for cuped in (False, True)
    }
    without, with_ = (forecast(traffic, plans[c], 0.2) for c in (False, True))
    assert np.isinf(without.total_s)
    assert np.isfinite(with_.total_s) and with_.covariate_share > 0.9
    assert any("CUPED" in line for line in with_.lines(3600))
    assert explained_share(0.0, 0.05, 100) == 0.0  # no spread: nothing to explain


def test_a_fixed_theta_is_used_as_given_and_its_variance_is_that_of_its_residuals() -> None:
    rng = np.random.default_rng(8)
    rate, shown = population(rng)
    control, canary = split(rng)
    arms = [arm_of(users, rate, shown, rng) for users in (control, canary)]
    fitted, fixed = cuped_difference(*arms), cuped_difference(*arms, theta=1.0)
    assert fitted is not None and fixed is not None
    assert fixed.theta == 1.0
    assert fixed.difference == pytest.approx(fixed.raw_difference - fixed.covariate_difference)
    assert fitted.variance <= fixed.variance < fixed.raw_variance  # fitted: the least
