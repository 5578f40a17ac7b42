"""``cascade train``: the offline pipeline (with no arguments: all of it on MovieLens-100K);
prints each model's test metrics and, as its last line, the path of ``report.json``.

Under torchrun (``torchrun --nproc_per_node N --no-python cascade train ...``) rank 0 runs
the pipeline and the other ranks join its data-parallel training steps
(``pipelines/training/distributed.py``; docs/scaling-out.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cli import options as opt
from core.files import writable_dir
from pipelines.config import TrainConfig


def add_parser(commands: Any) -> None:
    from pipelines.config import STEPS

    parser = commands.add_parser(
        "train",
        help="run the offline pipeline (data, features, training, evaluation, export)",
        description="Run the offline pipeline. With no steps named, runs all of them in order: "
        + ", ".join(STEPS)
        + ". Each step reads what the previous one wrote into --workdir.",
    )
    parser.add_argument(
        "steps",
        nargs="*",
        choices=[[], *STEPS],
        metavar="STEP",
        help=f"steps to run, from {', '.join(STEPS)} (default: all)",
    )
    opt.add_dataset_options(
        parser, "MovieLens-100K (from the recbole wheel) or the synthetic generator"
    )
    parser.add_argument(
        "--users", type=opt.positive_int, default=10_000, help="synthetic: number of users"
    )
    parser.add_argument(
        "--items", type=opt.positive_int, default=5_000, help="synthetic: number of items"
    )
    parser.add_argument(
        "--interactions",
        type=opt.positive_int,
        default=200_000,
        help="synthetic: number of interactions",
    )
    parser.add_argument(
        "--base-fraction",
        type=opt.fraction,
        default=1.0,
        help="train on the oldest fraction of the interactions only (by time): the newer "
        "ones are what arrives after this version, for `cascade retrain` to learn and the "
        "gate to judge on (the retrain walkthrough; default 1.0: all)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path("artifacts/work"),
        help="where intermediate data, models and the report go",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("artifacts"),
        help="root of the versioned export (model_repository/ and releases/)",
    )
    opt.add_config_options(parser, TrainConfig)


def run(args: argparse.Namespace) -> int:
    from pipelines.training import distributed

    return distributed.lead_or_follow(lambda: _run_pipeline(args))


def _run_pipeline(args: argparse.Namespace) -> int:
    from pipelines.pipeline import STEPS, run_pipeline

    overrides = {
        k: getattr(args, k) for k in TrainConfig.model_fields if getattr(args, k) is not None
    }
    config = TrainConfig(**overrides)
    writable_dir(args.workdir)
    if "export" in (args.steps or STEPS):
        writable_dir(args.output)
    report = run_pipeline(
        args.workdir,
        args.output,
        config,
        steps=tuple(args.steps) or STEPS,
        dataset=opt.dataset_source(args) or "movielens",
        synthetic_size=(args.users, args.items, args.interactions),
        base_fraction=args.base_fraction,
    )
    if report is None:
        return 0
    summary = json.loads(report.read_text())
    for section in ("retrieval", "ranking"):
        print(f"{section} (test):")
        for model, metrics in summary[section]["metrics"].items():
            print(f"  {model:<11} " + "  ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    print(report.resolve())
    return 0
