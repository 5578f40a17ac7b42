"""Canary analysis: the mixture SPRT against its formula, its error rate and power under repeated
looks (seeded simulations), SRM, guardrails and the hold outcomes."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict

import numpy as np
import pytest

from control.rollout.analysis import (
    SRM_MIN_EXPECTED,
    AnalysisConfig,
    ArmStats,
    Check,
    Decision,
    SequentialState,
    always_valid_ctr,
    analyse,
    srm_test,
)
from core.errors import ConfigError

CONFIG = AnalysisConfig()


def arm(
    n: int,
    clicks: int,
    *,
    errors: int = 0,
    degraded: int = 0,
    hits: int | None = None,
    p99_ms: float | None = 50.0,
) -> ArmStats:
    """One arm where every request is one impression."""
    hits = clicks if hits is None else hits
    return ArmStats(n, errors, degraded, n, clicks, hits, p99_ms)


def look(control: ArmStats, canary: ArmStats, weight: float = 0.5) -> Decision:
    return analyse(control, canary, weight, CONFIG, SequentialState())[0]


def check(decision: Decision, name: str) -> Check:
    return next(c for c in decision.checks if c.name == name)


def num(values: Mapping[str, float | int | None], key: str) -> float:
    """A number from a result dict (the dicts allow None where an arm is empty)."""
    value = values[key]
    assert value is not None, key
    return float(value)


# --- the mixture SPRT -------------------------------------------------------------------------


def test_always_valid_ctr_matches_the_formula():
    control, canary = arm(10_000, 500), arm(9_000, 405)
    tau, alpha = 0.004, 0.05
    got = always_valid_ctr(control, canary, tau, alpha)

    q1, q2 = 500.5 / 10_001, 405.5 / 9_001  # half pseudo-count in the variance
    s2 = q1 * (1 - q1) / 10_000 + q2 * (1 - q2) / 9_000
    t2 = tau**2
    theta = 405 / 9_000 - 500 / 10_000
    lam = math.sqrt(s2 / (s2 + t2)) * math.exp(t2 * theta**2 / (2 * s2 * (s2 + t2)))
    half = math.sqrt(s2 * (s2 + t2) / t2 * (math.log((s2 + t2) / s2) + 2 * math.log(1 / alpha)))

    assert got["difference"] == pytest.approx(theta, abs=1e-12)
    assert got["variance"] == pytest.approx(s2, rel=1e-9)
    assert got["likelihood_ratio"] == pytest.approx(lam, rel=1e-9)
    assert got["p_value"] == pytest.approx(min(1.0, 1 / lam), rel=1e-9)
    assert got["cs_lower"] == pytest.approx(theta - half, abs=1e-9)
    assert got["cs_upper"] == pytest.approx(theta + half, abs=1e-9)
    # duality: the sequence excludes 0 exactly when this look's p is below alpha
    excludes_zero = num(got, "cs_upper") < 0 or num(got, "cs_lower") > 0
    assert excludes_zero == (num(got, "p_value") < alpha)


def test_confidence_sequence_is_wider_than_the_fixed_n_interval():
    got = always_valid_ctr(arm(20_000, 1_000), arm(20_000, 950), 0.005, 0.05)
    fixed_half = 1.959964 * math.sqrt(num(got, "variance"))
    assert num(got, "cs_upper") - num(got, "difference") > fixed_half
    assert num(got, "difference") - num(got, "cs_lower") > fixed_half


def test_empty_arm_gives_no_estimate_and_p_one():
    got = always_valid_ctr(arm(1_000, 50), arm(0, 0), 0.005, 0.05)
    assert got["difference"] is None and got["cs_lower"] is None and got["p_value"] == 1.0


def test_always_valid_p_is_carried_and_never_rises():
    state = SequentialState()
    ps = []
    # the canary looks worse early, then catches up: the per-look p rises, the carried p may not
    for n, canary_clicks in [(2_000, 60), (4_000, 140), (8_000, 360), (16_000, 800)]:
        decision, state = analyse(arm(n, n // 20), arm(n, canary_clicks), 0.5, CONFIG, state)
        ps.append((decision.values["ctr_p_value"], decision.values["ctr_always_valid_p"]))
    per_look, carried = zip(*ps, strict=True)
    assert per_look[-1] > min(per_look)  # the data did move back towards equality
    assert list(carried) == sorted(carried, reverse=True)
    assert carried[-1] == pytest.approx(min(per_look)) and state.running_min_p == carried[-1]
    assert state.looks == 4
    assert SequentialState(**json.loads(json.dumps(asdict(state)))) == state


# --- repeated looks: error rate and power (seeded, counts drawn vectorised) --------------------


def simulate(
    ctr_canary: float, step: int, horizon: int, reps: int, seed: int, ctr_control: float = 0.05
) -> dict[str, np.ndarray]:
    """Per replication, whether any look failed or passed, looking every ``step`` per arm.

    Both arms also carry 1 % errors and 2 % degraded answers, so the guardrails see noise too.
    """
    rng = np.random.default_rng(seed)
    looks = horizon // step
    shape = (reps, looks)
    n = np.arange(1, looks + 1) * step
    counts = {
        name: rng.binomial(step, p, size=shape).cumsum(axis=1)
        for name, p in [
            ("clicks_control", ctr_control),
            ("clicks_canary", ctr_canary),
            ("errors_control", 0.01),
            ("errors_canary", 0.01),
            ("degraded_control", 0.02),
            ("degraded_canary", 0.02),
        ]
    }
    failed = np.zeros(reps, dtype=bool)
    passed = np.zeros(reps, dtype=bool)
    for r in range(reps):
        state = SequentialState()
        for k in range(looks):
            arms = [
                ArmStats(
                    requests=int(n[k]),
                    errors=int(counts[f"errors_{a}"][r, k]),
                    degraded=int(counts[f"degraded_{a}"][r, k]),
                    impressions=int(n[k]),
                    clicks=int(counts[f"clicks_{a}"][r, k]),
                    hits=int(counts[f"clicks_{a}"][r, k]),
                    p99_ms=50.0,
                )
                for a in ("control", "canary")
            ]
            decision, state = analyse(arms[0], arms[1], 0.5, CONFIG, state)
            failed[r] |= decision.outcome == "fail"
            passed[r] |= decision.outcome == "pass"
    return {"failed": failed, "passed": passed}


def test_a_a_never_fails_more_often_than_alpha_however_often_we_look():
    # 40 looks, every 500 impressions per arm up to 20,000: a fixed-n test would fail far more
    result = simulate(0.05, step=500, horizon=20_000, reps=400, seed=7)
    fraction = result["failed"].mean()
    assert fraction <= CONFIG.alpha + 0.01, f"A/A ever-fail fraction {fraction:.4f}"


def test_a_canary_twenty_percent_worse_fails_by_twenty_thousand_impressions():
    result = simulate(0.04, step=500, horizon=20_000, reps=400, seed=8)
    fraction = result["failed"].mean()
    assert fraction >= 0.90, f"power against a 20 % drop {fraction:.4f}"
    assert not result["passed"].any()


def test_an_equal_canary_passes_eventually():
    # proving "at most 5 % worse" at 5 % CTR takes of the order of 10^5 impressions per arm
    result = simulate(0.05, step=10_000, horizon=400_000, reps=200, seed=9)
    fraction = result["passed"].mean()
    assert fraction >= 0.9, f"equal canary passed in {fraction:.4f}"


def test_a_canary_just_outside_the_margin_rarely_passes():
    result = simulate(0.05 * 0.94, step=10_000, horizon=400_000, reps=200, seed=10)
    fraction = result["passed"].mean()
    assert fraction <= CONFIG.alpha, f"canary 6 % worse passed in {fraction:.4f}"


# --- sample-ratio mismatch ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("control", "canary", "weight"), [(5_000, 4_000, 0.5), (5_000, 5_050, 0.5), (9_100, 900, 0.1)]
)
def test_srm_matches_the_closed_form(control: int, canary: int, weight: float):
    chi2, p = srm_test(control, canary, weight)
    total = control + canary
    expected = [total * (1 - weight), total * weight]
    closed = sum((o - e) ** 2 / e for o, e in zip([control, canary], expected, strict=True))
    assert chi2 == pytest.approx(closed, rel=1e-12)
    assert p == pytest.approx(math.erfc(math.sqrt(closed / 2)), rel=1e-12)


def test_srm_cross_checked_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    chi2, p = srm_test(5_000, 5_050, 0.5)
    assert p == pytest.approx(stats.chi2.sf(chi2, df=1), rel=1e-9)


def _split_halt_rate(canary_share: float, looks: int, tau: float | None, reps: int = 1500) -> float:
    """Independent requests, 50 a look, 20 % assigned to the canary: the share of rollouts
    whose split test halts at some look (the canary's true share ``canary_share``)."""
    rng = np.random.default_rng(11)
    canary = np.cumsum(rng.binomial(50, canary_share, size=(reps, looks)), axis=1)
    total = 50 * np.arange(1, looks + 1)
    halted = 0
    for row in canary:
        for c, n in zip(row.tolist(), total.tolist(), strict=True):
            judged = n * 0.2 >= SRM_MIN_EXPECTED  # as the analysis judges
            if judged and srm_test(n - c, c, 0.2, None, tau)[1] < CONFIG.srm_alpha:
                halted += 1
                break
    return halted / reps


def test_the_split_test_keeps_its_level_however_many_looks_judge_it():
    # the one-look p, repeated, halts a healthy rollout more often the more it is looked at
    assert _split_halt_rate(0.2, looks=100, tau=None) > 3 * CONFIG.srm_alpha
    for looks in (10, 100):
        assert _split_halt_rate(0.2, looks, CONFIG.srm_tau) <= CONFIG.srm_alpha


def test_the_always_valid_split_test_finds_a_canary_short_of_its_share():
    # 15 % of requests where 20 % were assigned: found within 2,000 requests nearly always
    assert _split_halt_rate(0.15, looks=40, tau=CONFIG.srm_tau) >= 0.9


def test_split_mismatch_halts_before_anything_else():
    # the canary also breaches the error guardrail: the mismatch still decides first
    decision = look(arm(5_000, 250), arm(4_000, 200, errors=400))
    assert (decision.outcome, decision.reason) == ("halt", "srm")
    assert num(decision.values, "srm_p") < CONFIG.srm_alpha


def test_small_imbalance_is_no_mismatch():
    decision = look(arm(5_000, 250), arm(5_050, 250))
    assert check(decision, "srm").passed is True
    assert decision.outcome != "halt"


def test_srm_rejects_a_weight_outside_the_open_unit_interval():
    with pytest.raises(ConfigError, match="canary_weight"):
        srm_test(100, 0, 0.0)


def test_no_traffic_at_all_is_no_mismatch():
    assert srm_test(0, 0, 0.1) == (0.0, 1.0)


# --- guardrails ---------------------------------------------------------------------------------


def test_error_rate_breach_fails_even_when_ctr_looks_good():
    decision = look(arm(200_000, 10_000, errors=200), arm(200_000, 10_200, errors=6_000))
    assert (decision.outcome, decision.reason) == ("fail", "error_rate")
    assert check(decision, "ctr").passed is True  # the KPI alone would have passed


def test_guardrails_are_not_judged_below_min_requests():
    decision = look(arm(500, 25, errors=0), arm(500, 25, errors=100))
    assert check(decision, "error_rate").passed is None
    assert (decision.outcome, decision.reason) == ("hold", "insufficient_data")


def test_an_increase_within_noise_is_no_breach():
    # 1.5 points above production on 1,000 requests: above the limit, not yet significant
    decision = look(arm(1_000, 50, errors=10), arm(1_000, 50, errors=25))
    assert num(decision.values, "error_rate_difference") > CONFIG.max_error_rate_increase
    assert check(decision, "error_rate").passed is True


def test_degraded_rate_breach_fails():
    decision = look(arm(5_000, 250, degraded=50), arm(5_000, 250, degraded=400))
    assert (decision.outcome, decision.reason) == ("fail", "degraded_rate")


def test_p99_ratio_breach_fails():
    decision = look(arm(5_000, 250, p99_ms=40.0), arm(5_000, 250, p99_ms=80.0))
    assert (decision.outcome, decision.reason) == ("fail", "latency")
    assert decision.values["p99_ratio"] == pytest.approx(2.0)


def test_missing_p99_blocks_a_pass_but_fails_nothing():
    decision = look(arm(200_000, 10_000), arm(200_000, 10_000, p99_ms=None))
    assert check(decision, "ctr").passed is True
    assert check(decision, "latency").passed is None
    assert decision.outcome == "hold"


# --- KPI and holds ------------------------------------------------------------------------------


def test_a_clearly_worse_ctr_fails_and_an_equal_one_passes_with_enough_data():
    worse = look(arm(20_000, 1_000), arm(20_000, 700))
    assert (worse.outcome, worse.reason) == ("fail", "kpi_worse")
    assert num(worse.values, "ctr_cs_upper") < 0
    equal = look(arm(200_000, 10_000), arm(200_000, 10_000))
    assert (equal.outcome, equal.reason) == ("pass", "kpi_pass")
    assert num(equal.values, "ctr_cs_lower") > num(equal.values, "ctr_non_inferiority_bound")


def test_too_few_impressions_holds():
    decision = look(arm(800, 40), arm(800, 10))
    assert (decision.outcome, decision.reason) == ("hold", "insufficient_data")
    assert check(decision, "ctr").passed is None


def test_zero_traffic_on_the_canary_holds():
    # nothing at all yet, or too little for any check (5 % canary of 60 requests expects 3)
    for control in (arm(0, 0, p99_ms=None), arm(60, 3)):
        decision = look(control, arm(0, 0, p99_ms=None), weight=0.05)
        assert (decision.outcome, decision.reason) == ("hold", "insufficient_data")
        assert all(c.passed is None for c in decision.checks)


def test_decision_is_json_serialisable():
    decision = look(arm(5_000, 250), arm(5_000, 240))
    decoded = json.loads(json.dumps(asdict(decision), allow_nan=False))
    for key in ("ctr_difference", "ctr_cs_lower", "ctr_always_valid_p", "srm_chi2", "srm_p"):
        assert key in decoded["values"]
    assert "hit_rate_cs_upper" in decoded["values"]


def test_invalid_config_and_counts_are_refused():
    with pytest.raises(ConfigError, match="alpha"):
        AnalysisConfig(alpha=1.5)
    with pytest.raises(ConfigError, match="mixture_tau"):
        AnalysisConfig(mixture_tau=0.0)
    with pytest.raises(ConfigError, match="non_inferiority_margin"):
        AnalysisConfig(non_inferiority_margin=-0.1)
    with pytest.raises(ConfigError, match="max_p99_ratio"):
        AnalysisConfig(max_p99_ratio=0.9)
    with pytest.raises(ConfigError, match="min_impressions"):
        AnalysisConfig(min_requests=0)
    with pytest.raises(ValueError, match="negative"):
        ArmStats(10, -1, 0, 10, 0, 0, None)


def test_a_small_absolute_p99_difference_is_no_breach() -> None:
    control = ArmStats(5000, 0, 0, 50_000, 2500, 1500, p99_ms=2.0)
    canary = ArmStats(5000, 0, 0, 50_000, 2500, 1500, p99_ms=8.0)  # x4, but +6 ms
    decision, _ = analyse(control, canary, 0.5, AnalysisConfig(), SequentialState())
    latency = next(check for check in decision.checks if check.name == "latency")
    assert latency.passed is True and decision.reason != "latency"
    slow = ArmStats(5000, 0, 0, 50_000, 2500, 1500, p99_ms=80.0)  # x40 and +78 ms
    decision, _ = analyse(control, slow, 0.5, AnalysisConfig(), SequentialState())
    assert decision.outcome == "fail" and decision.reason == "latency"
    with pytest.raises(ConfigError, match="max_p99_increase_ms"):
        AnalysisConfig(max_p99_increase_ms=-1)
