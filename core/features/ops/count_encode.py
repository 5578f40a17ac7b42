"""Count encoding: how often each category id occurred in the training rows (log1p)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from core.features.ops.base import Columns, FeatureOp, lookup


class CountEncode(FeatureOp):
    """``log1p(count)`` of an id column; ids never seen in training get 0."""

    kind: ClassVar[str] = "count_encode"

    def __init__(self, column: str) -> None:
        self.column = column
        self.counts: np.ndarray | None = None

    @property
    def inputs(self) -> list[str]:
        return [self.column]

    @property
    def outputs(self) -> list[str]:
        return [f"{self.column}_count"]

    def partial_fit(self, columns: Columns) -> np.ndarray:
        """Occurrences of each id in these rows."""
        self._require(columns)
        return np.bincount(columns[self.column])

    def merge(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        total = np.zeros(max((len(p) for p in parts), default=0), dtype=np.int64)
        for counts in parts:
            total[: len(counts)] += counts
        return total

    def combine(self, parts: Sequence[np.ndarray]) -> None:
        self.counts = np.log1p(self.merge(parts)).astype(np.float32)

    def transform(self, columns: Columns) -> Columns:
        self._require(columns)
        assert self.counts is not None, "fit first"
        return {self.outputs[0]: lookup(self.counts, columns[self.column], 0.0)}

    def config(self) -> dict[str, Any]:
        return {"column": self.column}

    def arrays(self) -> dict[str, np.ndarray]:
        assert self.counts is not None, "fit first"
        return {"counts": self.counts}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.counts = arrays["counts"]
