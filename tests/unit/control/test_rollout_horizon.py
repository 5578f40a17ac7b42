"""A step's deadline reached undecided: ``no_traffic`` only without answers, ``inconclusive``
with the interval reached and the time it would have needed, and the setting that promotes a
non-inferior candidate instead (control.rollout.horizon, control.rollout.controller)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from control.registry import VersionState
from control.rollout.analysis import AnalysisConfig, ArmStats, SequentialState, analyse
from control.rollout.controller import RolloutPlan, RolloutRefused
from control.rollout.horizon import at_horizon, sample_factor
from control.rollout.sequential import half_width, variance_to_decide
from services.stores.memory import InMemoryStore
from tests.unit.control.test_rollout import Clock, _controller, _traffic, artifacts  # noqa: F401

CONFIG = AnalysisConfig(min_impressions=500, min_requests=50, non_inferiority_margin=0.05)


def _arm(requests: int, ctr: float, scale: float = 1.0) -> ArmStats:
    n = round(requests * scale)
    return ArmStats(n, 0, 0, 10 * n, round(10 * n * ctr), round(n * ctr), p99_ms=5.0)


def test_variance_to_decide_is_where_the_half_width_meets_the_distance() -> None:
    for distance, tau in ((0.002, 0.005), (0.01, 0.01), (0.05, 0.001)):
        variance = variance_to_decide(distance, tau, 0.05)
        assert half_width(variance, tau, 0.05) == pytest.approx(distance, rel=1e-9)
        assert half_width(variance * 1.01, tau, 0.05) > distance


def test_no_traffic_only_when_an_arm_got_no_answer_in_the_step() -> None:
    control, canary = _arm(400, 0.1), _arm(100, 0.1)  # counts of earlier steps
    for step in ((0, 0), (30, 0), (0, 30)):
        assert at_horizon(control, canary, step, CONFIG, 100.0).ending == "no_traffic"
    trickle = at_horizon(control, canary, (3, 1), CONFIG, 100.0)
    assert trickle.ending == "inconclusive"  # one answer is traffic, too little to decide


def test_inconclusive_reports_the_interval_and_the_time_a_decision_needs() -> None:
    control, canary = _arm(400, 0.1), _arm(400, 0.1)
    horizon = at_horizon(control, canary, (400, 400), CONFIG, 120.0)
    assert horizon.ending == "inconclusive" and horizon.interval is not None
    low, high = horizon.interval
    assert horizon.margin is not None and low < horizon.margin < 0.0 < high
    assert horizon.needed_factor is not None and horizon.needed_factor > 1
    assert horizon.needed_s == pytest.approx(120.0 * horizon.needed_factor)
    assert f"about {horizon.needed_s:.0f} s" in horizon.detail
    assert f"[{low:.4g}, {high:.4g}]" in horizon.detail
    # the estimate is right: with that many times the data (same rates) the test decides,
    # with clearly less it does not yet
    for scale, outcome in (
        (horizon.needed_factor * 1.02, "pass"),
        (horizon.needed_factor * 0.9, "hold"),
    ):
        decision, _ = analyse(
            _arm(400, 0.1, scale), _arm(400, 0.1, scale), 0.5, CONFIG, SequentialState()
        )
        assert decision.outcome == outcome, (scale, decision.checks)


def test_a_worse_canary_needs_the_time_to_show_it_worse() -> None:
    control, canary = _arm(300, 0.10), _arm(300, 0.09)
    factor = sample_factor(control, canary, CONFIG)
    assert factor is not None and factor > 1
    decision, _ = analyse(
        _arm(300, 0.10, factor * 1.02),
        _arm(300, 0.09, factor * 1.02),
        0.5,
        CONFIG,
        SequentialState(),
    )
    assert decision.outcome == "fail" and decision.reason == "kpi_worse"


def test_guardrails_short_of_requests_are_part_of_the_estimate() -> None:
    strict = dataclasses.replace(CONFIG, min_requests=4000)
    horizon = at_horizon(_arm(1000, 0.1), _arm(1000, 0.1), (1000, 1000), strict, 60.0)
    assert horizon.needed_factor is not None and horizon.needed_factor >= 4.0
    assert "guardrails short of 4000 requests per arm" in horizon.detail
    assert not horizon.non_inferior  # guardrails unjudged: never promoted at the horizon


def test_the_fixed_horizon_non_inferiority_test() -> None:
    even = at_horizon(_arm(3000, 0.1), _arm(3000, 0.1), (3000, 3000), CONFIG, 60.0)
    assert even.non_inferior  # the sequential bound is wider than the one final test's
    worse = at_horizon(_arm(3000, 0.1), _arm(3000, 0.093), (3000, 3000), CONFIG, 60.0)
    assert not worse.non_inferior


def test_the_setting_is_checked() -> None:
    with pytest.raises(RolloutRefused, match="on_inconclusive"):
        RolloutPlan(on_inconclusive="maybe")  # type: ignore[arg-type]


async def _until_done(controller, store, clock, rng, ctr, answers):  # type: ignore[no-untyped-def]
    record = controller.start(2)
    for _ in range(20):
        await _traffic(store, rng, record.weight, ctr, answers=answers)
        clock.now += 20
        record = await controller.look()
        if record.status != "running":
            return record
    raise AssertionError("the rollout never ended")


async def test_a_trickle_ends_inconclusive_at_the_deadline_and_stays_on_production(
    artifacts: Path,  # noqa: F811
) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(3)
    controller = _controller(artifacts, store, clock, weights=(0.5,))
    record = await _until_done(controller, store, clock, rng, {1: 0.1, 2: 0.1}, answers=30)
    assert (record.status, record.reason) == ("rolled_back", "inconclusive")
    assert "confidence sequence [" in record.detail and "a decision would take" in record.detail
    horizon = record.last_decision["horizon"]
    assert horizon["ending"] == "inconclusive" and horizon["needed_s"] > 100
    desired = controller.desired.read()
    assert desired is not None and desired.production == 1 and desired.canary is None
    assert controller.registry.get(2).state == VersionState.RETIRED  # type: ignore[union-attr]


@pytest.mark.parametrize("setting", ["stay", "promote_non_inferior"])
async def test_a_non_inferior_candidate_is_promoted_at_the_deadline_only_when_set(
    artifacts: Path,  # noqa: F811
    setting: str,
) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(5)
    analysis = dataclasses.replace(CONFIG, non_inferiority_margin=0.1)
    controller = _controller(
        artifacts, store, clock, weights=(0.5,), analysis=analysis, on_inconclusive=setting
    )
    record = await _until_done(controller, store, clock, rng, {1: 0.10, 2: 0.11}, answers=100)
    assert record.last_decision["horizon"]["non_inferior"]
    if setting == "stay":
        assert (record.status, record.reason) == ("rolled_back", "inconclusive")
    else:
        assert (record.status, record.reason) == ("promoted", "non_inferior")
        assert controller.registry.production() == 2
