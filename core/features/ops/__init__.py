"""One feature operator per module; ``REGISTRY`` maps a saved type tag back to its class."""

from core.features.ops.aggregate import GroupMean
from core.features.ops.base import Columns, FeatureOp
from core.features.ops.categorify import Categorify
from core.features.ops.count_encode import CountEncode
from core.features.ops.multi_hot import MultiHot
from core.features.ops.standardize import Standardize
from core.features.ops.target_encode import TargetEncode
from core.features.ops.temporal import Temporal

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
