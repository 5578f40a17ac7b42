"""Argument types of the ``cascade`` command line: every number is checked as it is parsed.

Each is an argparse ``type=``: it returns the value or raises ``ArgumentTypeError``, which
argparse prints as ``argument --interval-s: must be a finite number > 0, got 'inf'`` and
exits 2 (a usage error, core/exit_codes.py) before the command does anything.
"""

from __future__ import annotations

import argparse
import math
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel, ValidationError

from core.errors import UsageError
from pipelines.config import BUILT_IN

Parse = Callable[[str], Any]


def _bounds(gt: float | None, ge: float | None, lt: float | None, le: float | None) -> str:
    """``in (0, 1]``, ``> 0``, ``<= 1``... (empty: no bound)."""
    low = (f"({gt:g}", f"> {gt:g}") if gt is not None else None
    low = (f"[{ge:g}", f">= {ge:g}") if ge is not None else low
    high = (f"{lt:g})", f"< {lt:g}") if lt is not None else None
    high = (f"{le:g}]", f"<= {le:g}") if le is not None else high
    if low is not None and high is not None:
        return f"in {low[0]}, {high[0]}"
    return (low or high or ("", ""))[1]


def number(
    kind: type[int] | type[float] = float,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> Parse:
    """A type that accepts an int (or a finite float) within the bounds given."""
    noun = "an integer" if kind is int else "a finite number"
    rule = f"must be {noun} {_bounds(gt, ge, lt, le)}".rstrip()

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}") from None
        inside = (
            math.isfinite(value)
            and (gt is None or value > gt)
            and (ge is None or value >= ge)
            and (lt is None or value < lt)
            and (le is None or value <= le)
        )
        if not inside:
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


positive_float = number(float, gt=0)
non_negative_float = number(float, ge=0)
positive_int = number(int, ge=1)
non_negative_int = number(int, ge=0)
fraction = number(float, gt=0, le=1)  # a share of something, all of it allowed
probability = number(float, gt=0, lt=1)  # an error rate: neither never nor always
margin = number(float, ge=0, lt=1)  # a relative loss allowed: 1 (100 %) would allow any
port = number(int, ge=1, le=65535)
port_or_off = number(int, ge=0, le=65535)  # 0: do not listen


def increasing_weights(text: str) -> tuple[float, ...]:
    """Comma-separated canary weights, each in (0, 1), none below the one before."""
    rule = "must be canary weights in (0, 1) separated by commas, none below the one before"
    try:
        weights = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{rule}, got {text!r}") from None
    inside = all(math.isfinite(w) and 0 < w < 1 for w in weights)
    if not inside or list(weights) != sorted(weights):
        raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
    return weights


def model_field(model: type[BaseModel], name: str) -> Parse:
    """The type of a numeric field of a pydantic model: its bounds (``ge``/``gt``/``le``/
    ``lt``), then its own validators (e.g. ``dlrm_dim`` a multiple of 4)."""
    field = model.model_fields[name]
    kinds = [a for a in typing.get_args(field.annotation) if a is not type(None)]
    annotation = kinds[0] if kinds else field.annotation
    if annotation not in (int, float):
        raise TypeError(f"{model.__name__}.{name} is not a number")
    kind: type[int] | type[float] = int if annotation is int else float
    bounds: dict[str, float] = {}
    for rule in field.metadata:
        for key in ("gt", "ge", "lt", "le"):
            if isinstance(rule, getattr(annotated_types, key.capitalize())):
                bounds[key] = getattr(rule, key)
    check = number(kind, **bounds)

    def parse(text: str) -> Any:
        value = check(text)
        try:
            model.__pydantic_validator__.validate_assignment(model.model_construct(), name, value)
        except ValidationError as error:
            message = error.errors()[0]["msg"].removeprefix("Value error, ")
            raise argparse.ArgumentTypeError(f"{message}, got {text!r}") from None
        return value

    parse.__name__ = kind.__name__
    return parse


ARTIFACTS_HELP = "export root (default: CASCADE_ARTIFACTS, else ./artifacts)"


def add_artifacts(parser: argparse.ArgumentParser) -> None:
    """``--artifacts``: the one definition every command that reads the export root uses."""
    parser.add_argument("--artifacts", type=Path, default=None, help=ARTIFACTS_HELP)


class HelpWithDefaults(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already says what it is
    (``default`` in the text: the way to explain an unset value); flags and unset values
    show none rather than ``(default: None)``."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        silent = (
            "default" in text.lower()
            or action.default in (None, argparse.SUPPRESS)
            or action.nargs == 0  # flags: store_true, store_const, --help, --version
            or not action.option_strings
        )
        return text if silent else f"{text} (default: %(default)s)"


def _option_type(annotation: Any) -> Any:
    """The scalar type of a field annotation (``int | None`` -> ``int``)."""
    if typing.get_origin(annotation) is typing.Literal:
        return annotation
    options = [a for a in typing.get_args(annotation) if a is not type(None)]
    return options[0] if options else annotation


def add_config_options(parser: argparse.ArgumentParser, config: type[BaseModel]) -> None:
    """One ``--option`` per field of ``config`` (``TrainConfig``), with the field's
    description as help (and its default, unless the description says what it is);
    unset options keep the config's value."""
    for name, field in config.model_fields.items():
        text = (field.description or "").replace("%", "%%")  # argparse formats help with %
        if "default" not in text.lower():
            text = f"{text} (default: {field.default})"
        kind = _option_type(field.annotation)
        extra: dict[str, Any] = {"type": kind}
        if kind in (int, float):  # its bounds and validators, checked as it is parsed
            extra = {"type": model_field(config, name)}
        elif kind is bool:  # --flag / --no-flag
            extra = {"action": argparse.BooleanOptionalAction}
        elif typing.get_origin(kind) is typing.Literal:
            extra = {"type": str, "choices": list(typing.get_args(kind))}
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            default=None,
            help=text,
            **extra,
        )


def settings(args: argparse.Namespace, **overrides: Any) -> Any:
    from services.settings import Settings

    if args.artifacts is not None:
        overrides["artifacts"] = args.artifacts
    return Settings(**overrides)


def add_dataset_options(
    parser: argparse.ArgumentParser, built_in_help: str, default: str | None = "movielens"
) -> None:
    """``--dataset`` (a built-in data set) or ``--data`` (a team's own, by its dataset file),
    one or the other; ``dataset_source`` reads the choice (None: neither, and no default)."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--dataset", choices=list(BUILT_IN), default=default, help=built_in_help)
    source.add_argument(
        "--data",
        type=Path,
        default=None,
        metavar="DATASET_YAML",
        help="your own data: a dataset file naming your event logs and item and user tables "
        "(docs/your-data.md); replaces --dataset (default: none, --dataset is used)",
    )


def dataset_source(args: argparse.Namespace) -> str | None:
    """The built-in data set's name, or the dataset file's path (checked to exist)."""
    if args.data is None:
        return None if args.dataset is None else str(args.dataset)
    if not args.data.is_file():
        raise UsageError(f"--data {args.data}: no such file (a dataset file, e.g. dataset.yaml)")
    return str(args.data)
