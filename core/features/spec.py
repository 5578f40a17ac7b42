"""The feature workflow a data set's schema calls for, and the model inputs built from it.

What each declared feature adds is decided in ``core/features/schema.py``; this module turns
that into feature ops (``build_workflow``) and assembles the ranker's dense input.
"""

from __future__ import annotations

import numpy as np

from core.features.ops import (
    Categorify,
    Columns,
    CountEncode,
    FeatureOp,
    GroupMean,
    MultiHot,
    Standardize,
    TargetEncode,
    Temporal,
)
from core.features.schema import MOVIELENS, TIME_CARDINALITY, FeatureSchema
from core.features.workflow import Workflow

LABEL = "label"
LIKED_RATING = 4.0  # ranking: label = rating >= 4, rows with rating == 3 dropped
WEIGHT = "weight"  # a row's weight in the ranking models' losses (1 when absent)
DENSE = "dense"  # standardised [rows, len(schema.dense_inputs)]


def build_workflow(schema: FeatureSchema, min_frequency: int = 1, seed: int = 0) -> Workflow:
    """The fitted-once workflow every model and the serving side share, for ``schema``
    (what each declared feature adds: ``core/features/schema.py``)."""
    ops: list[FeatureOp] = [
        Categorify("user_id", min_frequency),
        Categorify("item_id", min_frequency),
    ]
    for feature in (*schema.user, *schema.item):
        if feature.kind == "multi_categorical":
            ops.append(MultiHot(feature.name, feature.separator or "|"))
        else:
            rare = max(feature.min_frequency, min_frequency) if feature.min_frequency > 1 else 1
            ops.append(Categorify(feature.name, rare, numeric=feature.kind == "numeric"))
    aged = schema.item_age
    ops += [
        Temporal("timestamp", aged.name if aged is not None else None),
        CountEncode("user_id_idx"),
        CountEncode("item_id_idx"),
        TargetEncode("user_id_idx", LABEL, seed=seed),
        TargetEncode("item_id_idx", LABEL, seed=seed + 1),
    ]
    ops += [
        TargetEncode(f"{feature.name}_idx", LABEL, seed=seed + 2 + i)
        for i, feature in enumerate(schema.target_encoded)
    ]
    ops += [
        GroupMean("user_id_idx", f.name, f"user_mean_item_{f.name}")
        for f in schema.item
        if f.kind == "numeric"
    ]
    ops += [
        GroupMean("item_id_idx", f.name, f"item_mean_user_{f.name}")
        for f in schema.user
        if f.kind == "numeric"
    ]
    ops.append(Standardize(list(schema.dense_inputs), DENSE))
    return Workflow(ops, schema)


def default_workflow(min_frequency: int = 1, seed: int = 0) -> Workflow:
    """The MovieLens workflow (``build_workflow`` of ``MOVIELENS``)."""
    return build_workflow(MOVIELENS, min_frequency, seed)


def dense_block(encoded: Columns, schema: FeatureSchema) -> np.ndarray:
    """The ranker's dense input: the standardised dense columns, then the multi-hot blocks."""
    blocks = [encoded[DENSE], *(encoded[name] for name in schema.multi_hot_columns)]
    return np.concatenate(blocks, axis=1).astype(np.float32)


def cardinality(workflow: Workflow, column: str) -> int:
    """Embedding-table size for a sparse column."""
    if column in TIME_CARDINALITY:
        return TIME_CARDINALITY[column]
    op = workflow.op(column)
    if isinstance(op, MultiHot):
        assert op.vocabulary is not None
        return len(op.vocabulary) + 1
    assert isinstance(op, Categorify)
    return op.cardinality
