"""The ``cascade`` command line: one module per command beside this one (``cli/train.py``,
``cli/serve.py``, ...), each with ``add_parser`` and ``run``; shared options in
``cli/options.py``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from cli import options as opt
from core.errors import UsageError
from core.exit_codes import EPILOG, fail
from services.util.server_log import configure_server_logging


def _commands() -> dict[str, tuple[Callable[[Any], None], Callable[[argparse.Namespace], int]]]:
    """Every subcommand: name -> (add its parser, run it). Each command module imports what
    it runs lazily, so `cascade --help` stays fast."""
    from cli import (
        catalog,
        materialize,
        operator,
        recommend,
        registry,
        report,
        retrain,
        rollout,
        serve,
        simulate,
        train,
    )

    return {
        "train": (train.add_parser, train.run),
        "serve": (serve.add_parser, serve.run),
        "materialize": (materialize.add_parser, materialize.run),
        "versions": (registry.versions_parser, registry.run_versions),
        "gc": (registry.gc_parser, registry.run_gc),
        "simulate": (simulate.add_parser, simulate.run),
        "retrain": (retrain.add_parser, retrain.run),
        "rollout": (rollout.add_rollout_parser, rollout.run_rollout),
        "rollback": (operator.add_rollback_parser, operator.run_rollback),
        "promote": (operator.add_promote_parser, operator.run_promote),
        "report": (report.add_parser, report.run),
        "catalog": (catalog.add_parser, catalog.run),
        "recommend": (recommend.add_parser, recommend.run),
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cascade-recsys")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """``cascade`` and every subcommand, each option's help ending with its default."""
    parser = argparse.ArgumentParser(
        prog="cascade",
        description="Cascade: multi-stage recommendation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cascade {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    for add_parser, _ in _commands().values():
        add_parser(commands)
    for command in commands.choices.values():
        command.formatter_class = opt.HelpWithDefaults
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    table = _commands()
    args = parser.parse_args(argv)
    if args.command == "serve":  # a line per state change and one when ready, with times
        configure_server_logging()
    try:
        return table[args.command][1](args)
    except Exception as error:  # one line and an exit code (core/exit_codes.py)
        usage = isinstance(error, UsageError)
        return fail(error, f"cascade {args.command}" if usage else "cascade")


if __name__ == "__main__":
    sys.exit(main())
