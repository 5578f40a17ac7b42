"""The gate's thresholds: one typed config, defaults in code and in the packaged ``gate.yaml``.

``load_gate_config(None)`` reads the packaged ``gate.yaml`` (a test keeps it equal to the
defaults below); ``load_gate_config(path)`` reads an operator's file, where any field left
out keeps its default. Metric names: ``recall@10``, ``ndcg@10`` (retrieval, full ranking,
per user), ``auc``, ``logloss`` (the served blend of DLRM and trees, per row).

A threshold that makes its check vacuous is refused with its key: a floor outside its
metric's range (recall, NDCG, AUC lie in [0, 1]; a LogLoss ceiling must be above 0), a
non-inferiority margin outside [0, 1) (negative asks for superiority, 1 or more lets any
loss pass), and any value that is not a finite number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, cast

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.errors import ConfigError

DEFAULT_FILE = Path(__file__).with_name("gate.yaml")
Metric = Literal["recall@10", "ndcg@10", "auc", "logloss"]
LOWER_IS_BETTER = frozenset({"logloss"})


_DEFAULT_MARGINS: dict[Metric, float] = {
    "recall@10": 0.05,
    "ndcg@10": 0.05,
    "auc": 0.01,
    "logloss": 0.02,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Floors(_Strict):
    """Absolute floors on the whole holdout (logloss: a ceiling)."""

    recall_at_10: float = Field(0.02, alias="recall@10", description="Lowest Recall@10.")
    ndcg_at_10: float = Field(0.02, alias="ndcg@10", description="Lowest NDCG@10.")
    auc: float = Field(0.6, description="Lowest AUC of the served ranker.")
    logloss: float = Field(0.69, description="Highest LogLoss (0.693 is a coin flip).")

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)

    def as_dict(self) -> dict[str, float]:
        return self.model_dump(by_alias=True)


class NonInferiority(_Strict):
    """Candidate vs production, paired bootstrap over holdout users."""

    margins: dict[Metric, float] = Field(
        default_factory=lambda: dict(_DEFAULT_MARGINS),
        description="Relative margin per metric: the lower bound of the confidence interval of "
        "(candidate - production) / production (for logloss: (production - candidate) / "
        "production) must be above -margin.",
    )
    confidence: float = Field(0.95, gt=0.5, lt=1, description="Two-sided interval level.")
    resamples: int = Field(1000, ge=100, description="Bootstrap resamples.")
    seed: int = Field(0, description="Seed of the resampling.")


class SliceRule(_Strict):
    """A declared slice: at least ``min_users`` users (retrieval) and ``min_rows`` ranking
    rows on the holdout, and its own floors (metrics not named are not checked)."""

    min_users: int = Field(20, ge=1, description="Fewest holdout users with a positive.")
    min_rows: int = Field(100, ge=1, description="Fewest ranking rows (both labels present).")
    floors: dict[Metric, float] = Field(default_factory=dict, description="Floors of the slice.")


def _default_slices() -> dict[str, SliceRule]:
    return {
        "new_users": SliceRule(
            min_users=20, min_rows=100, floors={"recall@10": 0.005, "auc": 0.55}
        ),
        "heavy_users": SliceRule(
            min_users=10, min_rows=100, floors={"recall@10": 0.01, "auc": 0.55}
        ),
        "long_tail_items": SliceRule(min_users=20, min_rows=100, floors={"auc": 0.55}),
    }


class SliceDefinitions(_Strict):
    """How the declared slices are cut (from the data before the holdout)."""

    heavy_user_fraction: float = Field(
        0.2, gt=0, lt=1, description="Heavy users: the most active fraction of known users."
    )
    head_item_fraction: float = Field(
        0.2, gt=0, lt=1, description="Long tail: items outside the most popular fraction."
    )


class Sanity(_Strict):
    """Checks that need no comparison."""

    min_score_std: float = Field(1e-6, ge=0, description="Scores with a lower spread fail.")
    onnx_tolerance: float = Field(
        1e-3, gt=0, description="Largest |ONNX - torch| on holdout inputs (both models)."
    )
    ann_recall_at_100: float = Field(
        0.95, gt=0, le=1, description="ANN index vs exact search on the new embeddings."
    )
    ann_queries: int = Field(500, ge=10, description="Holdout users whose queries are searched.")
    smoke: bool = Field(True, description="Load the export in the gateway and ask for an answer.")


class Holdout(_Strict):
    """How much of the holdout is evaluated."""

    max_users: int = Field(5000, ge=10, description="Seeded sample of users (full ranking).")
    max_rows: int = Field(200_000, ge=100, description="Seeded sample of ranking rows.")
    min_users: int = Field(30, ge=1, description="A holdout with fewer users fails the gate.")


class LoggedEvents(_Strict):
    """How much logged organic feedback (events about no logged answer: vouched for by no
    one) a retrain may learn from and the gate may judge on."""

    organic_user_share: float = Field(
        0.02,
        gt=0,
        le=1,
        description="One user's organic rows are capped at this share of the organic rows "
        "(or organic_min_cap, whichever is larger); the earliest are kept.",
    )
    organic_item_share: float = Field(
        0.02, gt=0, le=1, description="The same cap for one item's organic rows."
    )
    organic_min_cap: int = Field(
        20, ge=1, description="A user or item may always have this many organic rows."
    )
    max_unvouched_holdout_share: float = Field(
        0.2,
        gt=0,
        le=1,
        description="A holdout more than this share organic events (not the base data set) "
        "fails the gate: whoever sent them would decide the verdict. 1 = never fails.",
    )


def floor_problem(metric: Metric, value: float) -> str | None:
    """Why a floor (LogLoss: a ceiling) could never fail or never pass, or None."""
    if metric in LOWER_IS_BETTER:
        return None if value > 0 else f"{value:g} is not above 0, so the check could never pass"
    if value < 0:
        return f"{value:g} is below 0, so the check could never fail"
    if value > 1:
        return f"{value:g} is above 1, so the check could never pass"
    return None


def margin_problem(metric: Metric, value: float) -> str | None:
    """Why a relative non-inferiority margin is not one, or None (margins lie in [0, 1))."""
    if value < 0:
        return (
            f"{value:g} is below 0: the candidate would have to beat production by "
            f"{-value:.0%}, so an equal candidate could never pass"
        )
    if value >= 1 and metric in LOWER_IS_BETTER:
        return (
            f"{value:g} is not below 1: a candidate with {1 + value:g} times production's "
            "LogLoss would pass"
        )
    if value >= 1:
        return (
            f"{value:g} is not below 1: it allows losing {value:.0%} of production's "
            f"{metric}, so the check could never fail"
        )
    return None


class GateConfig(_Strict):
    """Every threshold of the validation gate."""

    floors: Floors = Floors()
    non_inferiority: NonInferiority = NonInferiority()
    slices: dict[str, SliceRule] = Field(default_factory=_default_slices)
    slice_definitions: SliceDefinitions = SliceDefinitions()
    sanity: Sanity = Sanity()
    holdout: Holdout = Holdout()
    logged_events: LoggedEvents = LoggedEvents()

    @model_validator(mode="after")
    def _every_check_can_fail(self) -> GateConfig:
        floors: list[tuple[str, dict[Metric, float]]] = [
            ("floors", cast(dict[Metric, float], self.floors.as_dict())),
            *((f"slices.{name}.floors", rule.floors) for name, rule in self.slices.items()),
        ]
        problems = [
            (f"{where}.{metric}", floor_problem(metric, value))
            for where, thresholds in floors
            for metric, value in thresholds.items()
        ]
        problems += [
            (f"non_inferiority.margins.{metric}", margin_problem(metric, value))
            for metric, value in self.non_inferiority.margins.items()
        ]
        found = [f"{key}: {problem}" for key, problem in problems if problem is not None]
        if found:
            raise ValueError("; ".join(found))
        return self


def _describe(error: ValidationError) -> str:
    """pydantic's errors as ``key.path: what is wrong (got value)``, joined by ``; ``."""
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"] if part != "[key]")
        what = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            what = "unknown key"
        elif item["type"] != "value_error":
            what = f"{what[:1].lower()}{what[1:]} (got {item['input']!r})"
        lines.append(f"{where}: {what}" if where else what)
    return "; ".join(lines)


def load_gate_config(path: Path | None = None) -> GateConfig:
    """Read the gate's YAML (default: the packaged ``gate.yaml``; defaults if absent)."""
    source = path or DEFAULT_FILE
    if path is None and not source.is_file():
        return GateConfig()
    try:
        raw = yaml.safe_load(source.read_text()) or {}
        return GateConfig.model_validate(raw)
    except FileNotFoundError:
        raise ConfigError(f"gate config {source} does not exist") from None
    except OSError as error:  # a directory, no permission
        raise ConfigError(f"cannot read gate config {source}: {error.strerror}") from None
    except ValidationError as error:
        raise ConfigError(f"gate config {source}: {_describe(error)}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"gate config {source}: {error}") from None
