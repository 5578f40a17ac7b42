"""The gate's thresholds: one typed config, defaults in code and in the packaged ``gate.yaml``.

``load_gate_config(None)`` reads the packaged ``gate.yaml`` (a test keeps it equal to the
defaults below); ``load_gate_config(path)`` reads an operator's file, where any field left
out keeps its default. Metric names: ``recall@10``, ``ndcg@10`` (retrieval, full ranking,
per user), ``auc``, ``logloss`` (the served blend of DLRM and trees, per row).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipelines.errors import ConfigError

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
    model_config = ConfigDict(extra="forbid")


class Floors(_Strict):
    """Absolute floors on the whole holdout (logloss: a ceiling)."""

    recall_at_10: float = Field(0.02, alias="recall@10", description="Lowest Recall@10.")
    ndcg_at_10: float = Field(0.02, alias="ndcg@10", description="Lowest NDCG@10.")
    auc: float = Field(0.6, description="Lowest AUC of the served ranker.")
    logloss: float = Field(0.69, description="Highest LogLoss (0.693 is a coin flip).")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

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


class GateConfig(_Strict):
    """Every threshold of the validation gate."""

    floors: Floors = Floors()
    non_inferiority: NonInferiority = NonInferiority()
    slices: dict[str, SliceRule] = Field(default_factory=_default_slices)
    slice_definitions: SliceDefinitions = SliceDefinitions()
    sanity: Sanity = Sanity()
    holdout: Holdout = Holdout()


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
    except (yaml.YAMLError, ValidationError) as error:
        raise ConfigError(f"gate config {source}: {error}") from None
