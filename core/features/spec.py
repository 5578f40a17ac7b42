"""Cascade's default feature set for the MovieLens schema, and the columns each model reads."""

from __future__ import annotations

from core.features.ops import (
    Categorify,
    CountEncode,
    GroupMean,
    MultiHot,
    Standardize,
    TargetEncode,
    Temporal,
)
from core.features.workflow import Workflow

LABEL = "label"
LIKED_RATING = 4.0  # ranking: label = rating >= 4, rows with rating == 3 dropped

# Categorical id columns, each one embedding table in DLRM (order = table order).
SPARSE_COLUMNS = (
    "user_id_idx",
    "item_id_idx",
    "gender_idx",
    "age_idx",
    "occupation_idx",
    "zip_code_idx",
    "year_idx",
    "genres_first_idx",
    "hour",
    "weekday",
)
# Cardinality of the columns that are not categorified (fixed ranges).
FIXED_CARDINALITY = {"hour": 24, "weekday": 7}

DENSE_INPUTS = (
    "user_id_idx_count",
    "item_id_idx_count",
    "user_id_idx_te_label",
    "item_id_idx_te_label",
    "occupation_idx_te_label",
    "user_mean_item_year",
    "item_mean_user_age",
    "item_age_years",
)
DENSE = "dense"  # standardised [rows, len(DENSE_INPUTS)]
GENRES = "genres_multi_hot"  # [rows, n_genres]

USER_TOWER_COLUMNS = ("user_id_idx", "gender_idx", "age_idx", "occupation_idx", "zip_code_idx")
ITEM_TOWER_COLUMNS = ("item_id_idx", "year_idx", "genres_first_idx")


def default_workflow(min_frequency: int = 1, seed: int = 0) -> Workflow:
    """The fitted-once workflow every model and the serving side share."""
    return Workflow(
        [
            Categorify("user_id", min_frequency),
            Categorify("item_id", min_frequency),
            Categorify("gender"),
            Categorify("age", numeric=True),
            Categorify("occupation"),
            Categorify("zip_code", min_frequency=max(2, min_frequency)),
            Categorify("year", numeric=True),
            MultiHot("genres"),
            Temporal("timestamp", "year"),
            CountEncode("user_id_idx"),
            CountEncode("item_id_idx"),
            TargetEncode("user_id_idx", LABEL, seed=seed),
            TargetEncode("item_id_idx", LABEL, seed=seed + 1),
            TargetEncode("occupation_idx", LABEL, seed=seed + 2),
            GroupMean("user_id_idx", "year", "user_mean_item_year"),
            GroupMean("item_id_idx", "age", "item_mean_user_age"),
            Standardize(list(DENSE_INPUTS), DENSE),
        ]
    )


def cardinality(workflow: Workflow, column: str) -> int:
    """Embedding-table size for a sparse column."""
    if column in FIXED_CARDINALITY:
        return FIXED_CARDINALITY[column]
    if column == "genres_first_idx":
        op = workflow.op(column)
        assert isinstance(op, MultiHot) and op.vocabulary is not None
        return len(op.vocabulary) + 1
    op = workflow.op(column)
    assert isinstance(op, Categorify)
    return op.cardinality
