"""Group aggregates: the mean of a (non-label) value per id, e.g. an item's mean viewer age."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from core.features.ops.base import Columns, MeanTableOp, lookup
from core.features.ops.exact_sum import ExactSums


class GroupMean(MeanTableOp):
    """Mean of ``value`` per id of ``key``, fitted on training rows; unseen ids get the global mean.

    Use it for values that are not the label (the label goes through ``TargetEncode``, which
    is out of fold).
    """

    kind: ClassVar[str] = "group_mean"

    def __init__(self, key: str, value: str, name: str) -> None:
        self.key = key
        self.value = value
        self.name = name
        self.means: np.ndarray | None = None
        self.prior = 0.0

    @property
    def inputs(self) -> list[str]:
        return [self.key, self.value]

    @property
    def transform_inputs(self) -> list[str]:
        return [self.key]

    @property
    def outputs(self) -> list[str]:
        return [self.name]

    def partial_fit(self, columns: Columns) -> tuple[ExactSums, np.ndarray]:
        """Exact sums and counts of the known values per id in these rows."""
        self._require(columns)
        ids = np.asarray(columns[self.key], dtype=np.int64)
        values = np.asarray(columns[self.value], dtype=np.float64)
        known = ~np.isnan(values)
        ids, values = ids[known], values[known]
        size = int(ids.max()) + 1 if len(ids) else 1
        return ExactSums.of(ids, values, size), np.bincount(ids, minlength=size)

    def merge(self, parts: Sequence[tuple[ExactSums, np.ndarray]]) -> tuple[ExactSums, np.ndarray]:
        size = max(len(counts) for _, counts in parts)
        counts = np.zeros(size, dtype=np.int64)
        for _, part in parts:
            counts[: len(part)] += part
        return ExactSums.merge([s for s, _ in parts], size), counts

    def combine(self, parts: Sequence[tuple[ExactSums, np.ndarray]]) -> None:
        sums, counts = self.merge(parts)
        known = int(counts.sum())
        total = sums.regrouped(np.zeros(len(sums.keys), np.int64), 1).fractions()[0]
        self.prior = float(total / known) if known else 0.0
        self.means = np.where(counts > 0, sums.floats() / np.maximum(counts, 1), self.prior).astype(
            np.float32
        )

    def transform(self, columns: Columns) -> Columns:
        if self.key not in columns:
            raise KeyError(f"{self.kind} needs column {self.key!r}")
        assert self.means is not None, "fit first"
        return {self.name: lookup(self.means, columns[self.key], self.prior)}

    def config(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "name": self.name}
