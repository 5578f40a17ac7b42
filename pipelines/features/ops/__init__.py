"""One feature operator per module; ``REGISTRY`` maps a saved type tag back to its class."""

from pipelines.features.ops.aggregate import GroupMean
from pipelines.features.ops.base import Columns, FeatureOp
from pipelines.features.ops.categorify import Categorify
from pipelines.features.ops.count_encode import CountEncode
from pipelines.features.ops.multi_hot import MultiHot
from pipelines.features.ops.standardize import Standardize
from pipelines.features.ops.target_encode import TargetEncode
from pipelines.features.ops.temporal import Temporal

REGISTRY: dict[str, type[FeatureOp]] = {
    op.kind: op
    for op in (Categorify, CountEncode, TargetEncode, GroupMean, Temporal, MultiHot, Standardize)
}

__all__ = [
    "REGISTRY",
    "Categorify",
    "Columns",
    "CountEncode",
    "FeatureOp",
    "GroupMean",
    "MultiHot",
    "Standardize",
    "TargetEncode",
    "Temporal",
]
