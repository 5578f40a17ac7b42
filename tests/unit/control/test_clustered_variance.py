"""Variances between user clusters (the KPI, the split test) and the latency guardrail's tail
test: the formulas, and A/A simulations on users who differ.

Real users differ in how much they click and come back many times, so impressions are not
independent trials: the binomial variance understates the noise of a CTR and an A/A rollout
then fails far more often than alpha. The clustered variance restores the error rate.
"""

from __future__ import annotations

import numpy as np
import pytest

from control.rollout.analysis import (
    AnalysisConfig,
    ArmStats,
    SequentialState,
    analyse,
    srm_test,
)
from control.rollout.state import (
    SPLIT_BUCKETS,
    USER_CLUSTERS,
    ArmCounts,
    RolloutRecord,
    assigned_split_variance,
    cluster_ratio_variance,
    user_bucket,
    user_cluster,
)

CONFIG = AnalysisConfig(min_impressions=2_000, min_requests=200)


def test_cluster_ratio_variance_matches_the_delta_method_formula():
    rng = np.random.default_rng(1)
    trials = rng.integers(0, 50, size=USER_CLUSTERS)
    trials[:5] = 0  # empty clusters do not count
    successes = rng.binomial(trials, 0.1)
    used = trials > 0
    k, total = used.sum(), trials.sum()
    ratio = successes.sum() / total
    expected = k / (k - 1) * np.sum((successes[used] - ratio * trials[used]) ** 2) / total**2
    got = cluster_ratio_variance(successes.tolist(), trials.tolist())
    assert got == pytest.approx(expected, rel=1e-12)


def test_cluster_ratio_variance_needs_two_clusters():
    assert cluster_ratio_variance([0, 3, 0], [0, 10, 0]) is None
    assert cluster_ratio_variance([0, 0], [0, 0]) is None


def test_independent_trials_give_about_the_binomial_variance():
    rng = np.random.default_rng(2)
    trials = np.full(USER_CLUSTERS, 400)
    ratios = []
    for _ in range(200):
        successes = rng.binomial(trials, 0.05)
        ratios.append(cluster_ratio_variance(successes.tolist(), trials.tolist()))
    binomial = 0.05 * 0.95 / trials.sum()
    assert np.mean(ratios) == pytest.approx(binomial, rel=0.1)


def test_arm_counts_keep_each_user_in_one_cluster():
    arm = ArmCounts()
    arm.add_request("42", impressions=10)
    arm.add_request("42", impressions=10)
    arm.add_click("42", hit=True)
    arm.add_request("7", impressions=10)
    arm.add_click("7", hit=False)
    c42, c7 = user_cluster("42"), user_cluster("7")
    requests, impressions, clicks, hits = arm.clusters
    assert (requests[c42], impressions[c42], clicks[c42], hits[c42]) == (2, 20, 1, 1)
    assert clicks[c7] == 1 and hits[c7] == 0
    assert (arm.requests, arm.impressions, arm.clicks, arm.hits) == (3, 30, 2, 1)
    stats = arm.stats()
    assert stats.ctr_variance is not None and stats.hit_rate_variance is not None


def _arm(requests: np.ndarray, clicks: np.ndarray, users: np.ndarray, clustered: bool) -> ArmStats:
    """Stats of one arm from per-user cumulative requests and clicks (10 items per answer)."""
    arm = ArmCounts()
    clusters = users % USER_CLUSTERS
    hits = np.minimum(clicks, requests)  # at most one hit per answer
    for row, values in enumerate((requests, requests * 10, clicks, hits)):
        arm.clusters[row] = np.bincount(clusters, values, USER_CLUSTERS).astype(int).tolist()
    arm.requests, arm.impressions = int(requests.sum()), int(requests.sum() * 10)
    arm.clicks, arm.hits = int(clicks.sum()), int(hits.sum())
    stats = arm.stats()
    if clustered:
        return stats
    return ArmStats(stats.requests, 0, 0, stats.impressions, stats.clicks, stats.hits, 5.0)


def _fail_rate(clustered: bool, reps: int = 150, seed: int = 3, canary_lift: float = 1.0) -> float:
    """Users who differ (per-user CTR ~ Beta with mean 5 %, heavy and light users), half of
    them on a canary whose CTR is ``canary_lift`` times theirs; 20 looks; the share of
    rollouts that ever fail on the KPI."""
    rng = np.random.default_rng(seed)
    users, looks = 1_500, 20
    failed = 0
    for _ in range(reps):
        ctr = rng.beta(2.0, 38.0, size=users)
        activity = rng.gamma(1.0, 1.0, size=users)  # requests per look, mean 1
        on_canary = rng.random(users) < 0.5  # a fresh random split per rollout
        requests = rng.poisson(activity, size=(looks, users)).cumsum(axis=0)
        user_ctr = np.where(on_canary, ctr * canary_lift, ctr)
        clicks = rng.binomial(10 * np.diff(requests, axis=0, prepend=0), user_ctr).cumsum(axis=0)
        state = SequentialState()
        ids = np.arange(users)
        for look in range(looks):
            control = _arm(requests[look][~on_canary], clicks[look][~on_canary],
                           ids[~on_canary], clustered)  # fmt: skip
            canary = _arm(requests[look][on_canary], clicks[look][on_canary],
                          ids[on_canary], clustered)  # fmt: skip
            decision, state = analyse(control, canary, 0.5, CONFIG, state)
            if decision.outcome == "fail":
                failed += 1
                break
    return failed / reps


def test_a_a_on_users_who_differ_fails_at_most_alpha_with_the_clustered_variance():
    rate = _fail_rate(clustered=True)
    assert rate <= CONFIG.alpha + 0.02, f"A/A fail rate {rate:.3f} with the clustered variance"


def test_a_a_on_users_who_differ_fails_too_often_with_independent_impressions():
    # the flaw the clustered variance fixes: proves the simulation can tell the two apart
    rate = _fail_rate(clustered=False)
    assert rate > 2 * CONFIG.alpha, f"A/A fail rate {rate:.3f} with the binomial variance"


def test_a_canary_thirty_percent_worse_still_fails_with_the_clustered_variance():
    rate = _fail_rate(clustered=True, reps=60, seed=4, canary_lift=0.7)
    assert rate >= 0.8, f"power against a 30 % drop {rate:.3f}"


def _split_fail_rate(
    clustered: bool,
    reps: int = 300,
    seed: int = 6,
    users: int = 2_000,
    looks: int = 10,
    share: float = 0.2,
    heavy: bool = False,
    buckets: bool = True,
) -> float:
    """Users (not requests) are assigned to the canary at ``share``; activity differs a lot
    between users (``heavy``: Pareto(2), a few users make most requests, as in the rollout
    bench). The share of rollouts whose split test ever halts over ``looks`` looks;
    ``buckets`` False: a record without request buckets (the residuals between clusters)."""
    rng = np.random.default_rng(seed)
    halted = 0
    ids = np.array([user_bucket(str(user)) for user in range(users)])
    for _ in range(reps):
        activity = rng.pareto(2.0, users) + 1 if heavy else rng.gamma(0.3, 3.0, size=users)
        activity *= 1_200 / activity.sum() if heavy else 1.0  # 40 answers/s, 30 s looks
        on_canary = rng.random(users) < share
        record = RolloutRecord(id="x", version=2, production=1, weights=[share])
        split = record.split(f"{share:g}")
        clusters = ids % USER_CLUSTERS
        asked = np.zeros(SPLIT_BUCKETS, int)  # requests per bucket so far
        for _ in range(looks):
            requests = rng.poisson(activity)
            split.control += int(requests[~on_canary].sum())
            split.canary += int(requests[on_canary].sum())
            for arm, mask in ((0, ~on_canary), (1, on_canary)):
                counts = np.bincount(clusters[mask], requests[mask], USER_CLUSTERS)
                split.clusters[arm] = (
                    (np.asarray(split.clusters[arm]) + counts).astype(int).tolist()
                )
            if buckets:
                asked += np.bincount(ids, requests, SPLIT_BUCKETS).astype(int)
                split.buckets = {int(b): int(asked[b]) for b in np.flatnonzero(asked)}
            control, canary, weight, variance = record.split_test_counts()
            spread = variance if clustered else None
            _, p = srm_test(control, canary, weight, spread, CONFIG.srm_tau)
            if p < CONFIG.srm_alpha:
                halted += 1
                break
    return halted / reps


def test_the_split_test_on_users_who_differ_holds_its_level_with_the_clustered_variance():
    assert _split_fail_rate(clustered=True) <= 0.01
    assert _split_fail_rate(clustered=True, reps=100, buckets=False) <= 0.01  # older records


def test_the_split_test_holds_its_level_when_a_few_heavy_users_decide_a_small_share():
    # the rollout bench's population: 950 users, Pareto(2) activity, a 5 % first step
    rate = _split_fail_rate(clustered=True, reps=120, users=950, looks=30, share=0.05, heavy=True)
    assert rate <= 0.01, f"healthy rollouts halted by the split test: {rate:.3f}"


def test_the_assigned_variance_is_the_per_user_formula_when_no_users_share_a_bucket():
    requests = {str(user): 1 + user % 7 for user in range(40)}
    assert len({user_bucket(user) for user in requests}) == 40  # no collisions among these
    record = RolloutRecord(id="x", version=2, production=1, weights=[0.05, 0.25])
    for user, count in requests.items():
        for _ in range(count):
            record.split("0.05").add(user, canary=False)
            record.split("0.25").add(user, canary=True)
    *_, variance = record.split_test_counts()
    n = np.array(list(requests.values()), np.float64)
    # each user's requests under 5 % and under 25 %: min(w_s, w_t) - w_s w_t for each pair
    weight = 0.05 * 0.95 + 0.25 * 0.75 + 2 * (0.05 - 0.05 * 0.25)
    # less what users hashed at random would share a bucket in expectation
    per_user = (float(n @ n) - n.sum() ** 2 / SPLIT_BUCKETS) / (1 - 1 / SPLIT_BUCKETS)
    assert variance == pytest.approx(weight * per_user)
    assert assigned_split_variance([0.5], [np.zeros(SPLIT_BUCKETS)]) == 0.0


def test_the_split_test_on_requests_alone_halts_healthy_rollouts_when_users_differ():
    assert _split_fail_rate(clustered=False) > 0.05


def test_a_canary_that_gets_no_users_still_halts_with_the_clustered_variance():
    record = RolloutRecord(id="x", version=2, production=1, weights=[0.2])
    split = record.split("0.2")
    for user in range(500):
        for _ in range(3):
            split.add(str(user), canary=False)
    control, canary, weight, variance = record.split_test_counts()
    assert canary == 0 and srm_test(control, canary, weight, variance, CONFIG.srm_tau)[1] < 1e-6


def _latency_arm(slow_share: float, requests: int = 4_000, seed: int = 0) -> ArmStats:
    rng = np.random.default_rng(seed)
    latencies = np.where(rng.random(requests) < slow_share, rng.uniform(200, 400, requests),
                         rng.gamma(4.0, 2.0, requests))  # fmt: skip
    arm = ArmCounts(requests=requests, impressions=requests * 10)
    arm.add_latencies(latencies)
    return arm.stats()


def test_latency_noise_of_a_loaded_machine_does_not_roll_back():
    # both arms get the same 2 % of very slow requests: the p99s differ by chance only
    control, canary = _latency_arm(0.02, seed=1), _latency_arm(0.02, seed=2)
    decision, _ = analyse(control, canary, 0.5, CONFIG, SequentialState())
    latency = next(c for c in decision.checks if c.name == "latency")
    assert latency.passed is True, latency.detail


def test_a_canary_with_a_slower_tail_fails_the_latency_guardrail():
    control, canary = _latency_arm(0.0, seed=3), _latency_arm(0.05, seed=4)
    decision, _ = analyse(control, canary, 0.5, CONFIG, SequentialState())
    latency = next(c for c in decision.checks if c.name == "latency")
    assert latency.passed is False and decision.reason == "latency", latency.detail


def _dominant_user_halts(heaviest: bool, canary_share: float = 0.05, reps: int = 40) -> float:
    """A population where one user makes 5 % of all requests and sits on the canary (a 5 %
    step: the draw that happens to 1 in 20 rollouts), the others Pareto(2); the share of
    healthy rollouts the split test halts over 20 looks of 1,200 requests."""
    rng = np.random.default_rng(11)
    users, halted = 943, 0
    ids = np.array([user_bucket(str(user)) for user in range(users)])
    for _ in range(reps):
        activity = rng.pareto(2.0, users) + 1
        activity[0] = 0.0
        activity *= 0.95 / activity.sum()
        activity[0] = 0.05
        on_canary = rng.random(users) < canary_share
        on_canary[0] = True
        record = RolloutRecord(id="x", version=2, production=1, weights=[0.05])
        split = record.split("0.05")
        asked = np.zeros(users)
        for _ in range(20):
            asked += rng.multinomial(1_200, activity)
            canary = int(asked[on_canary].sum())
            split.canary, split.control = canary, int(asked.sum()) - canary
            per_bucket = np.bincount(ids, asked, SPLIT_BUCKETS).astype(int)
            split.buckets = {int(b): int(per_bucket[b]) for b in np.flatnonzero(per_bucket)}
            control, canary, weight, variance = record.split_test_counts()
            heavy = record.heaviest_user() if heaviest else 0.0
            if srm_test(control, canary, weight, variance, CONFIG.srm_tau, heavy)[1] < 0.01:
                halted += 1
                break
    return halted / reps


def test_one_heavy_user_drawn_into_a_small_canary_is_no_mismatch():
    # the normal tail alone halts these healthy rollouts; Bernstein's allowance does not
    assert _dominant_user_halts(heaviest=False) > 0.05
    assert _dominant_user_halts(heaviest=True) <= 0.025


def test_a_canary_short_of_its_share_still_halts_with_the_allowance():
    record = RolloutRecord(id="x", version=2, production=1, weights=[0.2])
    split = record.split("0.2")
    rng = np.random.default_rng(5)
    activity = rng.pareto(2.0, 5_000) + 1
    for number in rng.choice(5_000, size=20_000, p=activity / activity.sum()):
        user = str(number)  # a replica that routes only a third of the canary's users
        split.add(user, canary=user_bucket(user) % 15 == 0)
    control, canary, weight, variance = record.split_test_counts()
    assert record.heaviest_user() > 0
    assert (
        srm_test(control, canary, weight, variance, CONFIG.srm_tau, record.heaviest_user())[1]
        < 0.01
    )
