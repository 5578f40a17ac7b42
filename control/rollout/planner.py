"""How long a rollout will take to decide at the traffic there is, before it starts.

``measure_traffic`` reads the recent impression and feedback streams the way the rollout's
analysis does (answers, items shown, clicks the gateway vouched for, per user cluster) and
gives the answer rate, items per answer, the baseline CTR and its design effect (the
clustered variance of the CTR over the binomial one). ``forecast`` walks the plan's steps
with that traffic: the arms' counts accumulate over the rollout, as the controller's do, and
a step ends once the CTR test's confidence sequence clears its bound (the margin, for an
equivalent candidate), both arms have ``min_impressions`` and ``min_requests``, and
``min_step_s`` has passed. The time the confidence sequence clears it is computed as if
the estimate sat at the assumed difference: about the median time a rollout takes (half
decide earlier, half later). A step that needs longer than ``step_deadline_s`` would end
``inconclusive``: the forecast says so, with the deadline that would do.

With a fixed population of users (MovieLens' 943), the users each arm draws differ in their
own click rates by chance, and that difference does not shrink with time: the spread of
users' rates (``user_spread``) over the effective number of users in each arm is a floor
under the test's variance. A step whose floor keeps the confidence sequence wider than its
bound is reported as never deciding reliably.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from control.rollout.controller import RolloutPlan
from control.rollout.cuped import explained_share
from control.rollout.sequential import variance_to_decide
from control.rollout.state import ArmCounts
from services.events.attribution import SERVED
from services.stores.base import OnlineStore

READ_BATCH = 10_000
WINDOW_S = 600.0  # the recent traffic the plan is made from
STEP_LADDER = (0.05, 0.1, 0.25, 0.5)
"""The first steps ``--steps auto`` tries, least exposure first; each is followed by the
ladder's steps from 25 % up."""


@dataclass(frozen=True)
class Traffic:
    """The recent traffic a rollout would judge."""

    answers_per_s: float
    items_per_answer: float
    ctr: float
    design_effect: float = 1.0
    """The CTR's variance between user clusters over the binomial one (at least 1)."""
    user_variance: float = 0.0
    """The variance of users' own click rates (beyond the binomial noise of their counts):
    with a fixed population, the arms' users differ by chance, a floor on the CTR test's
    variance that more time never lowers (0: unknown, the design effect is used instead)."""
    effective_users: float = math.inf
    """(sum of users' answers)^2 / sum of squares: how many equally active users they count as."""
    answers: int = 0
    clicks: int = 0
    window_s: float = 0.0
    history_s: float = math.inf
    """How far back the logged answers go: the pre-period CUPED can use is at most this."""


@dataclass(frozen=True)
class StepForecast:
    weight: float
    seconds: float  # from the step's start to its decision
    kpi_s: float  # the CTR test alone
    counts_s: float  # min_impressions and min_requests alone
    within_deadline: bool


@dataclass(frozen=True)
class Forecast:
    traffic: Traffic
    effect: float
    """The relative CTR difference assumed (0: an equivalent candidate, must pass)."""
    steps: list[StepForecast] = field(default_factory=list)
    decidable: bool = True
    """False when no amount of traffic decides at ``effect`` (it sits on the margin)."""
    covariate_share: float = 0.0
    """The share of the users' spread their pre-rollout CTR removes (CUPED; 0: off)."""

    @property
    def total_s(self) -> float:
        return sum(step.seconds for step in self.steps)

    @property
    def within_deadline(self) -> bool:
        return self.decidable and all(step.within_deadline for step in self.steps)

    def lines(self, deadline_s: float) -> list[str]:
        """The forecast in words, one line per step, then the verdict."""
        t = self.traffic
        out = [
            f"plan: recent traffic {t.answers_per_s:.3g} answers/s, {t.items_per_answer:.3g} "
            f"items each, CTR {t.ctr:.4g} ({t.clicks} vouched clicks on {t.answers} answers "
            f"in {t.window_s:.0f} s), design effect {t.design_effect:.2f}"
        ]
        if self.covariate_share > 0:
            out.append(
                f"plan: CUPED: users' CTR before the rollout explains about "
                f"{self.covariate_share:.0%} of their spread (if the recent rate held before it)"
            )
        if not self.decidable:
            return [*out, "plan: no amount of traffic decides at this difference"]
        for number, step in enumerate(self.steps):
            if math.isinf(step.seconds):
                out.append(
                    f"plan: step {number} at {step.weight:.0%}: NEVER reliably: the users "
                    "each arm draws differ by chance more than the margin allows, however long "
                    "it runs (it decides only when the draw happens to favour one side)"
                )
                continue
            late = "" if step.within_deadline else f"  LONGER than the {deadline_s:.0f} s deadline"
            out.append(
                f"plan: step {number} at {step.weight:.0%}: about {step.seconds:.0f} s (CTR test "
                f"{step.kpi_s:.0f} s, minimum samples {step.counts_s:.0f} s){late}"
            )
        verdict = (
            f"plan: an equivalent candidate decides in about {self.total_s:.0f} s in all"
            if self.effect == 0
            else f"plan: at a {self.effect:+.0%} difference, about {self.total_s:.0f} s in all"
        )
        longest = max(step.seconds for step in self.steps)
        if math.isinf(longest):
            verdict = (
                "plan: a step cannot decide at this user population: larger --steps, a wider "
                "--margin, or more users"
            )
        elif not self.within_deadline:
            verdict += (
                f"; a step would end inconclusive at its {deadline_s:.0f} s deadline "
                f"(--step-deadline-s {math.ceil(longest)} or more, larger --steps or a "
                "wider --margin would decide)"
            )
        return [*out, verdict]


def forecast(traffic: Traffic, plan: RolloutPlan, effect: float = 0.0) -> Forecast:
    """Each step's time to its decision at ``traffic``, for a candidate whose CTR is
    ``effect`` (relative) away from production's: 0 must pass at the margin, an effect below
    ``-margin`` must fail."""
    config = plan.analysis
    p = min(max(traffic.ctr, 1e-6), 1 - 1e-6)
    per_user = traffic.user_variance > 0 and math.isfinite(traffic.effective_users)
    share = 0.0  # what the users' pre-rollout CTR explains of their spread (CUPED)
    if config.cuped and per_user:
        # items an average user (weighted by activity) saw in the pre-period, at this rate
        pre_s = min(config.cuped_pre_period_s, traffic.history_s)
        pre_items = traffic.answers_per_s * traffic.items_per_answer * pre_s
        share = explained_share(traffic.user_variance, p, pre_items / traffic.effective_users)
    # one impression's CTR variance: binomial, with the users' spread folded into the design
    # effect, or apart (per_user): then which of the arm's users ask, an answer of
    # ``items_per_answer`` items at a time, adds (items - 1) x their spread (CUPED's
    # pre-period, weighted by its own answers, does not remove it)
    unit = p * (1 - p) * max(traffic.design_effect, 1.0)
    if per_user:
        unit = p * (1 - p) + max(traffic.items_per_answer - 1.0, 0.0) * traffic.user_variance
    tau = config.mixture_tau * p
    margin = -config.non_inferiority_margin * p
    difference = effect * p
    # the bound the estimate must clear: the margin (pass), else 0 (fail), whichever is nearer
    distances = [d for d in (difference - margin, -difference) if d > 0]
    if not distances or traffic.answers_per_s <= 0 or traffic.items_per_answer <= 0:
        return Forecast(traffic, effect, decidable=False, covariate_share=share)
    allowed = variance_to_decide(max(distances), tau, config.alpha)
    fails = difference < 0 and -difference > difference - margin  # fail is reached first
    rate = traffic.answers_per_s
    items = traffic.items_per_answer
    answers = [0.0, 0.0]  # control, canary: cumulative over the rollout, as the controller's
    steps = []
    for weight in plan.weights:
        shares = (rate * (1 - weight), rate * weight)
        floor = 0.0  # the arms' users differ by chance: what no amount of time removes
        if per_user:
            users = traffic.effective_users
            floor = (
                (1 - share)
                * traffic.user_variance
                * (1 / (weight * users) + 1 / ((1 - weight) * users))
            )

        def variance_after(
            seconds: float,
            shares: tuple[float, float] = shares,
            before: list = answers,
            floor: float = floor,
        ) -> float:
            n = [(before[i] + shares[i] * seconds) * items for i in (0, 1)]
            return math.inf if min(n) <= 0 else floor + unit * (1 / n[0] + 1 / n[1])

        kpi_s = _first_time(lambda s: variance_after(s) <= allowed)
        # a pass waits for the guardrails' min_requests too; a KPI fail does not
        least = config.min_impressions / items
        if not fails:
            least = max(least, config.min_requests)
        counts_s = max(0.0, max((least - answers[i]) / shares[i] for i in (0, 1)))
        # a decision comes at a look, after the look that finds every replica applied the
        # step (one interval after it was set); a pass moves on min_step_s after that look
        seconds = max(kpi_s, counts_s, plan.interval_s)
        if not fails:
            seconds = max(seconds, plan.interval_s + plan.min_step_s)
        if math.isfinite(seconds):
            seconds = math.ceil(seconds / plan.interval_s) * plan.interval_s
        steps.append(
            StepForecast(weight, seconds, kpi_s, counts_s, seconds <= plan.step_deadline_s)
        )
        answers = [answers[i] + shares[i] * seconds for i in (0, 1)]
        if fails:  # a failing candidate is rolled back in this step
            break
    return Forecast(traffic, effect, steps, covariate_share=share)


def steps_from(first: float) -> tuple[float, ...]:
    """``first``, then the ladder's steps from 25 % up (0.05 -> 0.05, 0.25, 0.5)."""
    return (first, *(w for w in STEP_LADDER if w > first and w >= 0.25))


@dataclass(frozen=True)
class StepChoice:
    weights: tuple[float, ...]
    outlook: Forecast  # an equivalent candidate's forecast with these steps
    fits: bool  # every step decides within the deadline


def choose_steps(traffic: Traffic, plan: RolloutPlan) -> StepChoice:
    """The steps for ``--steps auto``: the smallest first step of ``STEP_LADDER`` at which an
    equivalent candidate (the slowest of those that must pass) decides every step within
    ``plan.step_deadline_s`` at ``traffic``; else the largest (``fits`` False). A large
    population keeps the 5 % first step; a small one, whose users differ by chance more than
    a 5 % arm can rule out, starts larger rather than never deciding."""
    choice = None
    for first in STEP_LADDER:
        weights = steps_from(first)
        outlook = forecast(traffic, dataclasses.replace(plan, weights=weights), 0.0)
        choice = StepChoice(weights, outlook, outlook.within_deadline)
        if choice.fits:
            break
    assert choice is not None
    return choice


def _first_time(check: Callable[[float], bool], horizon_s: float = 1e9) -> float:
    """The least time in [0, horizon_s] at which ``check(t)`` holds (monotone; bisection)."""
    if check(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while not check(high):
        if high > horizon_s:
            return math.inf
        low, high = high, high * 2
    for _ in range(60):
        middle = 0.5 * (low + high)
        low, high = (low, middle) if check(middle) else (middle, high)
    return high


async def measure_traffic(store: OnlineStore, now: float, window_s: float = WINDOW_S) -> Traffic:
    """Answers, items shown and vouched clicks logged in the last ``window_s`` seconds, all
    versions together (the rollout's production carries them before it starts)."""
    arm = ArmCounts()
    cursor = f"{int((now - window_s) * 1000)}-0"  # stream ids are millisecond timestamps
    first = last = None
    shown: Counter[str] = Counter()
    clicked: Counter[str] = Counter()
    while True:
        entries = await store.read_stream("impressions", cursor, READ_BATCH)
        for stream_id, fields in entries:
            cursor = stream_id
            stamp = _seconds(stream_id)
            first = stamp if first is None else first
            last = stamp
            user, items = fields.get("user_id", ""), len(fields.get("items", "").split())
            arm.add_request(user, items)
            shown[user] += items
        if len(entries) < READ_BATCH:
            break
    cursor = f"{int((now - window_s) * 1000)}-0"
    while True:
        entries = await store.read_stream("feedback", cursor, READ_BATCH)
        for stream_id, fields in entries:
            cursor = stream_id
            if fields.get("type") == "click" and fields.get("trust") == SERVED:
                arm.add_click(fields.get("user_id", ""), hit=fields.get("hit") == "1")
                clicked[fields.get("user_id", "")] += 1
        if len(entries) < READ_BATCH:
            break
    span = (last - first) if first is not None and last is not None else 0.0
    users = list(shown)
    traffic = traffic_of(
        arm,
        span,
        np.array([shown[u] for u in users], np.float64),
        np.array([clicked[u] for u in users], np.float64),
    )
    oldest = await store.read_stream("impressions", "0-0", 1)
    if not oldest:
        return traffic
    return dataclasses.replace(traffic, history_s=now - _seconds(oldest[0][0]))


def _seconds(stream_id: str) -> float:
    """The time of a stream entry: its id is ``<milliseconds>-<sequence>``."""
    return int(stream_id.split("-")[0]) / 1000.0


def user_spread(shown: np.ndarray, clicks: np.ndarray) -> tuple[float, float]:
    """(variance of users' own click rates, effective number of users) from each user's
    items shown and clicks: the impression-weighted variance of their observed rates minus
    what binomial noise alone gives (method of moments, at least 0)."""
    used = shown > 0
    n, x = shown[used], np.minimum(clicks[used], shown[used])
    if len(n) < 2:
        return 0.0, math.inf
    total = n.sum()
    rate = x.sum() / total
    observed = float((n * (x / n - rate) ** 2).sum() / total)
    noise = rate * (1 - rate) * len(n) / total  # the binomial part of that weighted variance
    return max(0.0, observed - noise), float(total**2 / (n * n).sum())


def traffic_of(
    arm: ArmCounts,
    span_s: float,
    shown: np.ndarray | None = None,
    clicks: np.ndarray | None = None,
) -> Traffic:
    """The traffic of ``arm``'s counts, gathered over ``span_s`` seconds (``shown`` and
    ``clicks``: per user, for the spread of their click rates)."""
    if arm.requests < 2 or span_s <= 0:
        return Traffic(0.0, 0.0, 0.0, answers=arm.requests, clicks=arm.clicks, window_s=span_s)
    stats = arm.stats()
    ctr = arm.clicks / arm.impressions if arm.impressions else 0.0
    binomial = ctr * (1 - ctr) / arm.impressions if arm.impressions else 0.0
    effect = 1.0
    if stats.ctr_variance is not None and binomial > 0:
        effect = max(1.0, stats.ctr_variance / binomial)
    spread, users = 0.0, math.inf
    if shown is not None and clicks is not None:
        spread, users = user_spread(shown, clicks)
    return Traffic(
        user_variance=spread,
        effective_users=users,
        answers_per_s=(arm.requests - 1) / span_s,
        items_per_answer=arm.impressions / arm.requests,
        ctr=ctr,
        design_effect=effect,
        answers=arm.requests,
        clicks=arm.clicks,
        window_s=span_s,
    )
