"""The ``cascade`` command line.

``cascade train`` runs the offline pipeline (with no arguments: the whole pipeline on
MovieLens-100K) and prints the path of its ``report.json`` as its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipelines.config import TrainConfig
from pipelines.errors import CascadeError


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    """One ``--option`` per TrainConfig field, with the field's description as help."""
    for name, field in TrainConfig.model_fields.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=type(field.default),
            default=None,
            help=f"{field.description or ''} (default: {field.default})",
        )


def _train_parser(commands: Any) -> None:
    from pipelines.pipeline import STEPS

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
    parser.add_argument(
        "--dataset",
        choices=["movielens", "synthetic"],
        default="movielens",
        help="MovieLens-100K (from the recbole wheel) or the synthetic generator",
    )
    parser.add_argument("--users", type=int, default=10_000, help="synthetic: number of users")
    parser.add_argument("--items", type=int, default=5_000, help="synthetic: number of items")
    parser.add_argument(
        "--interactions", type=int, default=200_000, help="synthetic: number of interactions"
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
    _add_config_options(parser)


def _run_train(args: argparse.Namespace) -> int:
    from pipelines.pipeline import STEPS, run_pipeline

    overrides = {
        k: getattr(args, k) for k in TrainConfig.model_fields if getattr(args, k) is not None
    }
    config = TrainConfig(**overrides)
    report = run_pipeline(
        args.workdir,
        args.output,
        config,
        steps=tuple(args.steps) or STEPS,
        dataset=args.dataset,
        synthetic_size=(args.users, args.items, args.interactions),
    )
    summary = json.loads(report.read_text())
    for section in ("retrieval", "ranking"):
        print(f"{section} (test):")
        for model, metrics in summary[section]["metrics"].items():
            print(f"  {model:<11} " + "  ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    print(report.resolve())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cascade", description="Cascade: multi-stage recommendation."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _train_parser(commands)
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return _run_train(args)
    except (CascadeError, ValidationError) as error:
        print(f"cascade: error: {error}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
