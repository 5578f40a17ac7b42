"""The rollout's forecast (control.rollout.planner) against rollouts simulated look by look
with the analysis itself on synthetic counts: the median time to a decision lies within a
factor of 1.5 of the forecast, for an equivalent, a better and a worse candidate."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import Counter

import numpy as np
import pytest

from control.rollout.analysis import AnalysisConfig, ArmStats, SequentialState, analyse
from control.rollout.controller import RolloutPlan
from control.rollout.planner import (
    Traffic,
    choose_steps,
    forecast,
    measure_traffic,
    steps_from,
    traffic_of,
)
from control.rollout.state import ArmCounts
from services.stores.memory import InMemoryStore
from tests.unit.control.test_rollout import _traffic

TRAFFIC = Traffic(answers_per_s=40.0, items_per_answer=10.0, ctr=0.05)
FACTOR = 1.5  # the stated agreement: measured median within [forecast / 1.5, forecast * 1.5]
PLANS = {
    "two steps, 10 % margin": RolloutPlan(
        weights=(0.2, 0.5),
        min_step_s=30,
        interval_s=10,
        step_deadline_s=7200,
        analysis=AnalysisConfig(non_inferiority_margin=0.1),
    ),
    "the defaults": RolloutPlan(interval_s=10, step_deadline_s=20_000),
}


def simulate(traffic: Traffic, plan: RolloutPlan, effect: float, rng: np.random.Generator):  # type: ignore[no-untyped-def]
    """One rollout, look by look as the controller takes them: Poisson answers split by the
    step's weight, binomial clicks at production's CTR and at ``effect`` relative to it. A
    step's time counts from its first look (the one that finds the replicas applied it).
    Returns (seconds to the decision, outcome)."""
    counts = np.zeros((2, 3))  # control, canary: answers, impressions, clicks (cumulative)
    state, step, seconds, expected = SequentialState(), 0, 0.0, 0.0
    in_step = -plan.interval_s
    while True:
        weight = plan.weights[step]
        answers = rng.poisson(traffic.answers_per_s * plan.interval_s)
        canary = rng.binomial(answers, weight)
        expected += answers * weight
        rates = (traffic.ctr, traffic.ctr * (1 + effect))
        for arm, n in ((0, answers - canary), (1, canary)):
            shown = n * int(traffic.items_per_answer)
            counts[arm] += (n, shown, rng.binomial(shown, rates[arm]))
        seconds += plan.interval_s
        in_step += plan.interval_s
        arms = [ArmStats(int(a), 0, 0, int(i), int(c), 0, p99_ms=5.0) for a, i, c in counts]
        share = expected / counts[:, 0].sum()
        decision, state = analyse(arms[0], arms[1], share, plan.analysis, state)
        if decision.outcome in ("fail", "halt"):
            return seconds, f"rolled_back:{decision.reason}"
        if decision.outcome == "pass" and in_step >= plan.min_step_s:
            if step + 1 == len(plan.weights):
                return seconds, "promoted"
            step, in_step = step + 1, -plan.interval_s
        elif decision.outcome == "hold" and in_step >= plan.step_deadline_s:
            return seconds, "inconclusive"


@pytest.mark.parametrize("name", sorted(PLANS))
@pytest.mark.parametrize(
    ("effect", "outcome"), [(0.0, "promoted"), (0.1, "promoted"), (-0.2, "rolled_back:kpi_worse")]
)
def test_the_forecast_matches_the_simulated_median_time_to_a_decision(
    name: str, effect: float, outcome: str
) -> None:
    plan = PLANS[name]
    rng = np.random.default_rng(0)
    runs = [simulate(TRAFFIC, plan, effect, rng) for _ in range(40)]
    outcomes = Counter(result for _, result in runs)
    assert outcomes[outcome] >= 36, outcomes
    measured = statistics.median(seconds for seconds, _ in runs)
    predicted = forecast(TRAFFIC, plan, effect).total_s
    assert predicted / FACTOR <= measured <= predicted * FACTOR, (measured, predicted)


def test_a_step_counts_from_the_look_that_finds_it_applied() -> None:
    """The controller sees a step applied at the look after it set it: a clear pass moves on
    ``min_step_s`` after that look, a clear fail comes at that look at the earliest."""
    plan = RolloutPlan(weights=(0.25, 0.5), interval_s=30, min_step_s=300)
    better = forecast(Traffic(400.0, 10.0, 0.05), plan, 0.5)
    assert [step.seconds for step in better.steps] == [330.0, 330.0]
    worse = forecast(Traffic(4000.0, 10.0, 0.05), plan, -0.9)
    assert [step.seconds for step in worse.steps] == [30.0]


def test_a_step_that_outlasts_its_deadline_is_called_out() -> None:
    """The walkthrough's numbers: 5 % of 40 answers/s cannot show a 5 % margin in an hour."""
    plan = RolloutPlan(interval_s=10, min_step_s=60)
    outlook = forecast(Traffic(40.0, 10.0, 0.05, design_effect=1.5), plan)
    assert not outlook.within_deadline and not outlook.steps[0].within_deadline
    assert outlook.steps[0].seconds > plan.step_deadline_s
    lines = outlook.lines(plan.step_deadline_s)
    assert "LONGER than the 3600 s deadline" in lines[1]
    assert f"--step-deadline-s {int(outlook.steps[0].seconds)}" in lines[-1]
    wider = RolloutPlan(
        weights=(0.2, 0.5),
        interval_s=10,
        min_step_s=60,
        analysis=AnalysisConfig(non_inferiority_margin=0.2),
    )
    assert forecast(Traffic(40.0, 10.0, 0.05, design_effect=1.5), wider).within_deadline


def test_a_difference_on_the_margin_never_decides() -> None:
    plan = RolloutPlan(analysis=AnalysisConfig(non_inferiority_margin=0.0))
    outlook = forecast(TRAFFIC, plan, 0.0)
    assert not outlook.decidable and not outlook.within_deadline
    assert "no amount of traffic decides" in outlook.lines(3600)[-1]
    assert not forecast(Traffic(0.0, 0.0, 0.0), RolloutPlan()).decidable


def test_traffic_of_gives_the_rate_ctr_and_the_clustered_design_effect() -> None:
    arm, rng = ArmCounts(), np.random.default_rng(1)
    for user in range(2000):  # each user clicks at their own rate: clustered clicks
        liking = rng.beta(0.5, 9.5)
        for _ in range(3):
            arm.add_request(str(user), 10)
            for _ in range(rng.binomial(10, liking)):
                arm.add_click(str(user), hit=False)
    traffic = traffic_of(arm, span_s=150.0)
    assert traffic.answers_per_s == pytest.approx(5999 / 150)
    assert traffic.items_per_answer == 10 and traffic.ctr == pytest.approx(0.05, abs=0.005)
    assert traffic.design_effect > 1.5  # heterogeneous users: far noisier than binomial
    assert traffic_of(ArmCounts(), 100.0).answers_per_s == 0


async def test_measure_traffic_reads_answers_and_vouched_clicks_of_the_window() -> None:
    store, rng = InMemoryStore(), np.random.default_rng(2)
    assert (await measure_traffic(store, time.time())).history_s == float("inf")
    started = time.time()
    await _traffic(store, rng, 0.0, {1: 0.1, 2: 0.1}, answers=300)
    traffic = await measure_traffic(store, time.time() + 1, window_s=60)
    assert traffic.answers == 300 and traffic.clicks > 0
    assert traffic.window_s >= 0
    later = await measure_traffic(store, time.time() + 600, window_s=60)
    assert later.answers == 0 and later.answers_per_s == 0
    # the logged answers go back about 600 s: CUPED's pre-period can be no longer
    assert 599 <= later.history_s <= time.time() - started + 601


def test_user_spread_recovers_the_variance_of_users_own_click_rates() -> None:
    from control.rollout.planner import user_spread

    rng = np.random.default_rng(4)
    rates = rng.beta(1.0, 19.0, 3000)  # variance 0.05 * 0.95 / 21
    shown = rng.integers(50, 400, 3000).astype(float)
    spread, users = user_spread(shown, rng.binomial(shown.astype(int), rates).astype(float))
    assert spread == pytest.approx(0.05 * 0.95 / 21, rel=0.2)
    assert 2000 < users < 3000
    same, _ = user_spread(shown, rng.binomial(shown.astype(int), 0.05).astype(float))
    assert same < 0.1 * spread  # equal users: (almost) nothing beyond binomial noise


def test_a_small_population_bounds_what_any_amount_of_time_can_show() -> None:
    """943 users whose own rates spread as Beta(1, 19): the arms' users differ by chance by
    more than a 5 % margin at a 5 % step allows, however long it runs (even a 20 % margin
    at 50 % does not); a 30 % margin at 50 % decides."""
    spread = 0.05 * 0.95 / 21
    crowd = Traffic(40.0, 10.0, 0.05, user_variance=spread, effective_users=600.0)
    plan = RolloutPlan(interval_s=10, min_step_s=60, analysis=AnalysisConfig(cuped=False))
    outlook = forecast(crowd, plan)
    assert outlook.steps[0].seconds == float("inf") and not outlook.within_deadline
    lines = outlook.lines(plan.step_deadline_s)
    assert "NEVER" in lines[1] and "cannot decide at this user population" in lines[-1]
    wide = RolloutPlan(
        weights=(0.5,),
        interval_s=10,
        min_step_s=60,
        analysis=AnalysisConfig(non_inferiority_margin=0.3, cuped=False),
    )
    assert forecast(crowd, wide).within_deadline


def test_auto_steps_start_small_on_a_large_population_and_larger_on_a_small_one() -> None:
    """--steps auto: the least exposure at which an equivalent candidate decides in time."""
    assert steps_from(0.05) == (0.05, 0.25, 0.5) and steps_from(0.1) == (0.1, 0.25, 0.5)
    assert steps_from(0.25) == (0.25, 0.5) and steps_from(0.5) == (0.5,)
    spread = 0.05 * 0.95 / 21  # users' own rates spread as Beta(1, 19)
    plan = RolloutPlan()
    many = Traffic(400.0, 10.0, 0.05, user_variance=spread, effective_users=200_000.0)
    choice = choose_steps(many, plan)
    assert choice.weights == (0.05, 0.25, 0.5) and choice.fits
    # MovieLens-sized (the bench's 943 users, ~270 effective), 40 answers/s for an hour,
    # CUPED on: a 5 % or 10 % arm does not rule out the chance difference between its users
    # within the hour's deadline
    few = Traffic(40.0, 10.0, 0.05, user_variance=spread, effective_users=270.0, history_s=3600)
    choice = choose_steps(few, plan)
    assert choice.weights == (0.25, 0.5) and choice.fits
    assert choice.outlook.within_deadline and choice.outlook.effect == 0
    assert not forecast(few, plan).within_deadline  # the fixed 5 % first step would not
    # a day of logged traffic before it: CUPED removes more of the users' spread
    day = dataclasses.replace(few, history_s=86_400.0)
    assert choose_steps(day, plan).weights == (0.1, 0.25, 0.5)
    # nothing decides within a short deadline at a tiny margin: the largest step, said so
    tight = RolloutPlan(
        min_step_s=60, step_deadline_s=120, analysis=AnalysisConfig(non_inferiority_margin=0.01)
    )
    choice = choose_steps(few, tight)
    assert choice.weights == (0.5,) and not choice.fits
