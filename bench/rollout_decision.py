"""Time to a rollout's decision at the walkthrough's traffic, against the planner's forecast.

The real rollout controller (``control.rollout.controller``) drives repeated A/A and A/B
rollouts on an in-memory store, time compressed: a fake clock advances one ``--interval-s``
per look and the look's answers and clicks are logged as a gateway logs them (40 answers/s,
10 items each). Users are MovieLens-100K-sized (943), each with their own click rate (a beta
distribution around the baseline CTR, so clicks cluster by user as real ones do), assigned to
the canary by a salted hash that keeps them as the weight grows; the candidate's click rate
is production's times ``1 + effect`` (better +20 %, worse -20 %, equivalent and A/A 0).
No models run: this measures the controller and its analysis, not a ranking.

Reports per scenario the outcome counts, the median and 90th percentile time to decision,
the planner's forecast from the same traffic, and the false rollback rate (A/A) or the power
(better promoted, worse rolled back). Last line: one JSON object (also
``bench/results/rollout_decision.json``)::

    .venv/bin/python bench/rollout_decision.py --repetitions 10
    .venv/bin/python bench/rollout_decision.py --steps 0.2,0.5 --margin 0.1 --min-step-s 60

``--steps auto`` (the default, as ``cascade rollout``'s) chooses the steps with the planner
from the measured traffic and the pre-period, per CUPED setting.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from control.registry import FileRegistry
from control.rollout.analysis import AnalysisConfig
from control.rollout.controller import RolloutController, RolloutPlan
from control.rollout.planner import choose_steps, forecast, traffic_of
from control.rollout.state import ArmCounts, FileRolloutLog
from services.state.desired_state import FileDesiredState
from services.stores.memory import InMemoryStore
from tests.unit.control.fake_exports import production_and_candidate

USERS = 943  # MovieLens-100K's
ITEMS_PER_ANSWER = 10
SCENARIOS = {"aa": 0.0, "equivalent": 0.0, "better": 0.2, "worse": -0.2}
RESULTS = Path(__file__).resolve().parent / "results" / "rollout_decision.json"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0  # set to the wall clock at the start (the store's stream ids)

    def __call__(self) -> float:
        return self.now


class Users:
    """Each user's click rate, and their arm under a rollout's salt."""

    def __init__(self, ctr: float, concentration: float, rng: np.random.Generator) -> None:
        self.rate = rng.beta(ctr * concentration, (1 - ctr) * concentration, USERS)
        self.activity = rng.pareto(2.0, USERS) + 1  # a few heavy users, as in MovieLens
        self.activity /= self.activity.sum()

    def bucket(self, salt: str) -> np.ndarray:
        hashes = [zlib.crc32(f"{salt}:{user}".encode()) for user in range(USERS)]
        return np.array(hashes) % 10_000 / 10_000


def answers_of(
    users: Users,
    rng: np.random.Generator,
    answers: int,
    canary_of: np.ndarray,
    weight: float,
    effect: float,
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """``answers`` answers as a gateway logs them (version 2 the canary), and their clicks."""
    chosen = rng.choice(USERS, size=answers, p=users.activity)
    split = f"2:{weight:g}" if weight > 0 else ""
    impressions, clicks = [], []
    for user in chosen:
        canary = bool(canary_of[user])
        rate = users.rate[user] * (1 + effect if canary else 1)
        request_id = f"{rng.integers(2**62):032x}"[-32:]
        version = "2" if canary else "1"
        impressions.append(
            {"request_id": request_id, "user_id": str(user), "model_version": version,
             "split": split, "items": " ".join(map(str, range(ITEMS_PER_ANSWER))),
             "scores": "1 " * ITEMS_PER_ANSWER, "degraded": "0", "reasons": "",
             "latency_ms": "5.0", "timestamp": "0"}
        )  # fmt: skip
        shown = rng.random(ITEMS_PER_ANSWER) < min(rate, 1.0)
        for rank in np.flatnonzero(shown):
            clicks.append(
                {"user_id": str(user), "item_id": str(rank), "type": "click",
                 "model_version": version, "request_id": request_id,
                 "hit": "1" if rank == np.flatnonzero(shown)[0] else "0", "trust": "served"}
            )  # fmt: skip
    return impressions, clicks


async def log_events(
    store: InMemoryStore, events: tuple[list[dict[str, str]], list[dict[str, str]]]
) -> None:
    impressions, clicks = events
    if impressions:
        await store.append_impressions(impressions, max_len=10**8, ttl_s=10**6)
    if clicks:
        await store.append_feedback(clicks, max_len=10**8, idempotency_ttl_s=10**6)


async def one_rollout(
    plan: RolloutPlan,
    users: Users,
    effect: float,
    rate: float,
    seed: list[int],
    pre_period: tuple[list[dict[str, str]], list[dict[str, str]]],
) -> dict[str, Any]:
    """One rollout; ``seed`` fixes its traffic, clicks and users' arms, whatever the plan."""
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as directory:
        root = production_and_candidate(Path(directory) / "artifacts")
        clock, store = Clock(), InMemoryStore()
        await log_events(store, pre_period)  # production only, before the rollout
        await asyncio.sleep(0.002)
        clock.now = time.time()  # the start cursor follows the pre-period's stream ids
        controller = RolloutController(
            root,
            FileRegistry(root / "registry.json"),
            FileDesiredState(root / "rollout" / "desired.json"),
            FileRolloutLog(root / "rollout"),
            store,
            plan,
            clock=clock,
        )
        record = controller.start(2)
        await asyncio.sleep(0.002)
        # the bench routes: its own salt per seed, so both settings see the same arms
        bucket = users.bucket("-".join(map(str, seed)))
        started = clock.now
        reduction = []
        while record.status == "running":
            answers = int(rng.poisson(rate * plan.interval_s))
            weight = record.weight
            events = answers_of(users, rng, answers, bucket < weight, weight, effect)
            await log_events(store, events)
            clock.now += plan.interval_s
            record = await controller.look()  # type: ignore[assignment]
            value = ((record.last_decision or {}).get("values") or {}).get(
                "ctr_cuped_variance_reduction"
            )
            if value is not None:
                reduction.append(value)
        return {
            "outcome": f"{record.status}:{record.reason}",
            "seconds": clock.now - started,
            "step": record.step,
            "variance_reduction": reduction[-1] if reduction else None,
        }


async def baseline_traffic(users: Users, rate: float, rng: np.random.Generator) -> Any:
    """Ten minutes of production-only traffic, measured as ``cascade rollout`` measures it."""
    arm = ArmCounts()
    shown, clicks = np.zeros(USERS), np.zeros(USERS)
    chosen = rng.choice(USERS, size=int(rate * 600), p=users.activity)
    for user in chosen:
        arm.add_request(str(user), ITEMS_PER_ANSWER)
        shown[user] += ITEMS_PER_ANSWER
        for _ in range(rng.binomial(ITEMS_PER_ANSWER, users.rate[user])):
            arm.add_click(str(user), hit=False)
            clicks[user] += 1
    return traffic_of(arm, 600.0 * (len(chosen) - 1) / len(chosen), shown, clicks)


def summary(name: str, runs: list[dict[str, Any]], predicted: float | None) -> dict[str, Any]:
    times = [r["seconds"] for r in runs]
    outcomes = Counter(r["outcome"] for r in runs)
    n = len(runs)
    guard_or_kpi = ("kpi_worse", "error_rate", "degraded_rate", "latency", "srm")
    rolled_back = sum(r["outcome"].split(":")[1] in guard_or_kpi for r in runs)
    promoted = sum(r["outcome"].startswith("promoted") for r in runs)
    line: dict[str, Any] = {
        "runs": n,
        "outcomes": dict(outcomes),
        "median_s": statistics.median(times),
        "p90_s": float(np.percentile(times, 90)),
        "forecast_s": predicted,
    }
    reductions = [r["variance_reduction"] for r in runs if r.get("variance_reduction") is not None]
    if reductions:
        line["cuped_variance_reduction_median"] = round(statistics.median(reductions), 3)
    if name == "aa":
        line["false_rollback_rate"] = round(rolled_back / n, 3)
    elif name == "worse":
        line["power"] = round(rolled_back / n, 3)
    else:
        line["power" if name == "better" else "promoted_rate"] = round(promoted / n, 3)
    return line


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=10)
    parser.add_argument("--rate", type=float, default=40.0, help="answers per second")
    parser.add_argument("--ctr", type=float, default=0.05)
    parser.add_argument("--concentration", type=float, default=20.0, help="user CTR beta a+b")
    parser.add_argument("--steps", default="auto", help="canary weights, or auto (planner)")
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--min-step-s", type=float, default=300.0)
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument("--step-deadline-s", type=float, default=3600.0)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument(
        "--cuped", choices=("on", "off", "both"), default="both",
        help="adjust the CTR test by users' pre-rollout CTR; both: paired runs, same seeds",
    )  # fmt: skip
    parser.add_argument(
        "--pre-period-s", type=float, default=3600.0,
        help="production-only traffic logged before each rollout (the covariate's events)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cuped-theta",
        type=lambda text: None if text == "fitted" else float(text),
        default=AnalysisConfig.cuped_theta,
        help="fixed theta, or `fitted` at each look (default: the controller's)",
    )
    parser.add_argument("--min-impressions", type=int, default=AnalysisConfig.min_impressions)
    args = parser.parse_args()
    settings = ["off", "on"] if args.cuped == "both" else [args.cuped]
    plans = {
        setting: RolloutPlan(
            weights=RolloutPlan.weights
            if args.steps == "auto"
            else tuple(float(w) for w in args.steps.split(",")),
            min_step_s=args.min_step_s,
            interval_s=args.interval_s,
            step_deadline_s=args.step_deadline_s,
            analysis=AnalysisConfig(
                non_inferiority_margin=args.margin,
                min_impressions=args.min_impressions,
                cuped=setting == "on",
                cuped_pre_period_s=args.pre_period_s + 60.0,
                cuped_theta=args.cuped_theta,
            ),
        )
        for setting in settings
    }
    rng = np.random.default_rng(args.seed)
    users = Users(args.ctr, args.concentration, rng)
    traffic = await baseline_traffic(users, args.rate, rng)
    if args.steps == "auto":  # as `cascade rollout` chooses them, the pre-period logged
        logged = dataclasses.replace(traffic, history_s=args.pre_period_s)
        for setting, candidate in plans.items():
            weights = choose_steps(logged, candidate).weights
            plans[setting] = dataclasses.replace(candidate, weights=weights)
    plan = plans[settings[0]]
    answers = int(rng.poisson(args.rate * args.pre_period_s))
    no_canary = np.zeros(USERS, bool)
    pre_period = answers_of(users, rng, answers, no_canary, 0.0, 0.0)
    print(
        f"traffic: {traffic.answers_per_s:.1f} answers/s, CTR {traffic.ctr:.4f}, design effect "
        f"{traffic.design_effect:.2f}, users' own CTR sd {traffic.user_variance**0.5:.4f} over "
        f"{traffic.effective_users:.0f} effective users; plan {list(plan.weights)}, "
        f"margin {args.margin:g}, "
        f"min step {plan.min_step_s:g} s, deadline {plan.step_deadline_s:g} s; pre-period "
        f"{args.pre_period_s:g} s ({answers} answers)",
        flush=True,
    )
    results: dict[str, Any] = {}
    for index, name in enumerate(args.only.split(",")):
        effect = SCENARIOS[name]
        for setting in settings:
            outlook = forecast(traffic, plans[setting], effect)
            predicted = outlook.total_s if outlook.decidable else None
            started, runs = time.perf_counter(), []
            for repetition in range(args.repetitions):
                seed = [args.seed, index, repetition]
                runs.append(
                    await one_rollout(plans[setting], users, effect, args.rate, seed, pre_period)
                )
            key = f"{name}/cuped_{setting}"
            results[key] = {"steps": list(plans[setting].weights), **summary(name, runs, predicted)}
            print(
                f"{key:<20} effect {effect:+.0%}: {results[key]} "
                f"({time.perf_counter() - started:.0f} s wall)",
                flush=True,
            )
    record = {
        "bench": "rollout_decision",
        "rate": args.rate,
        "plan": {
            "steps": list(plan.weights),
            "margin": args.margin,
            "min_step_s": plan.min_step_s,
            "interval_s": plan.interval_s,
            "step_deadline_s": plan.step_deadline_s,
            "pre_period_s": args.pre_period_s,
            "min_impressions": args.min_impressions,
            "cuped_theta": args.cuped_theta,
            "seed": args.seed,
        },
        "traffic": {
            "ctr": round(traffic.ctr, 4),
            "design_effect": round(traffic.design_effect, 2),
            "user_ctr_sd": round(traffic.user_variance**0.5, 4),
            "effective_users": round(traffic.effective_users),
        },
        "scenarios": results,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    asyncio.run(main())
