"""``cascade simulate``: drive a running gateway with simulated users (``control/simulator.py``)."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from cli import options as opt
from control.simulator import (
    POPULATIONS,
    Preferences,
    SimulationPlan,
    population,
    report_json,
    simulate,
)
from core.errors import CascadeError, UsageError


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "simulate",
        help="drive a running gateway with simulated users who click by a ground truth",
        description="Send /v1/recommend requests for a population of users to a running "
        "gateway at a fixed rate for a fixed time and post the clicks a ground-truth "
        "preference model draws (MovieLens ratings, or the synthetic generator's latent "
        "affinity). Prints impressions, clicks, CTR and hit rate per model version; the last "
        "line is one JSON object.",
    )
    plan = SimulationPlan()
    parser.add_argument("--url", default=plan.url, help="the gateway")
    parser.add_argument(
        "--rate", type=opt.positive_float, default=plan.rate, help="requests per second"
    )
    parser.add_argument(
        "--duration", type=opt.positive_float, default=plan.duration_s, help="seconds"
    )
    parser.add_argument(
        "--max-requests",
        type=opt.positive_int,
        default=plan.max_requests,
        help="stop after this many",
    )
    parser.add_argument(
        "--k", type=opt.number(int, ge=1, le=500), default=plan.k, help="items per answer"
    )
    parser.add_argument(
        "--concurrency",
        type=opt.positive_int,
        default=plan.concurrency,
        help="requests in flight at most",
    )
    parser.add_argument(
        "--seed", type=opt.non_negative_int, default=plan.seed, help="users and clicks drawn"
    )
    parser.add_argument(
        "--dataset",
        choices=["movielens", "synthetic"],
        default="movielens",
        help="the ground truth: the data set the served models were trained on",
    )
    parser.add_argument("--users", type=opt.positive_int, default=10_000, help="synthetic: users")
    parser.add_argument("--items", type=opt.positive_int, default=5_000, help="synthetic: items")
    parser.add_argument(
        "--interactions", type=opt.positive_int, default=200_000, help="synthetic: interactions"
    )
    parser.add_argument(
        "--data-seed", type=opt.non_negative_int, default=0, help="synthetic: generator seed"
    )
    parser.add_argument(
        "--population",
        choices=POPULATIONS,
        default="all",
        help="who sends requests: everyone, or a shifted population (drift scenarios)",
    )
    parser.add_argument(
        "--shift-at",
        type=opt.non_negative_float,
        default=None,
        metavar="SECONDS",
        help="switch to the --shift-to population this many seconds into the run (default: "
        "no shift)",
    )
    parser.add_argument(
        "--shift-to",
        choices=POPULATIONS,
        default=None,
        help="the population requests come from after --shift-at (heavy: the most active "
        "tenth; new: unknown users, cold starts; young/old: an age shift; default: none)",
    )
    parser.add_argument(
        "--feedback-key-file",
        type=Path,
        default=Path("artifacts") / "feedback.key",
        help="the gateway's feedback client key (first line); CASCADE_FEEDBACK_KEY wins",
    )


def feedback_key(path: Path) -> str | None:
    """The client key to post feedback with: ``CASCADE_FEEDBACK_KEY``, else the first line
    of ``path`` (``cascade serve`` writes one there for the embedded stack), else None."""
    key = os.environ.get("CASCADE_FEEDBACK_KEY", "").strip()
    if key:
        return key
    try:
        lines = path.read_text().split()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise CascadeError(f"--feedback-key-file {path}: cannot read ({error.strerror})") from None
    return lines[0] if lines else None


def run(args: argparse.Namespace) -> int:
    if (args.shift_at is None) != (args.shift_to is None):
        raise UsageError("--shift-at and --shift-to go together (when, and to whom)")
    if args.shift_at is not None and not args.shift_at < args.duration:
        raise UsageError(
            f"--shift-at must be below --duration ({args.duration:g}), got {args.shift_at:g}"
        )
    if args.dataset == "movielens":
        from pipelines.data.movielens import load_movielens_100k

        dataset = load_movielens_100k()
    else:
        from pipelines.data.synthetic import make_synthetic

        dataset = make_synthetic(args.users, args.items, args.interactions, seed=args.data_seed)
    plan = SimulationPlan(
        url=args.url,
        rate=args.rate,
        duration_s=args.duration,
        max_requests=args.max_requests,
        k=args.k,
        concurrency=args.concurrency,
        seed=args.seed,
        shift_at_s=args.shift_at,
        feedback_key=feedback_key(args.feedback_key_file),
    )
    if plan.feedback_key is None:
        print(
            f"simulate: no feedback key (CASCADE_FEEDBACK_KEY unset, no {args.feedback_key_file}):"
            " clicks are refused unless the gateway accepts feedback without one",
            flush=True,
        )
    users = population(dataset, args.population)
    shifted = None if args.shift_to is None else population(dataset, args.shift_to)
    print(
        f"simulate: {len(users)} users ({args.population}) -> {args.url}, "
        f"{args.rate:g}/s for {args.duration:g} s"
        + (
            ""
            if shifted is None
            else f", then {len(shifted)} ({args.shift_to}) after {args.shift_at:g} s"
        ),
        flush=True,
    )
    report = asyncio.run(
        simulate(plan, users, Preferences(dataset), lambda line: print(line, flush=True), shifted)
    )
    print(report.table())
    print(report_json(report))
    if report.errors and not report.per_version:
        raise CascadeError(f"no answer from {args.url}: is `cascade serve` running?")
    return 0
