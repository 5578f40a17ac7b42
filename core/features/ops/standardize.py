"""Standardise dense columns to zero mean, unit variance (fitted on training rows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from core.features.ops.base import Columns, FeatureOp
from core.features.ops.exact_sum import ExactSums


class Standardize(FeatureOp):
    """Stack the named 1-D columns into one standardised ``[rows, n]`` float32 ``output``."""

    kind: ClassVar[str] = "standardize"

    def __init__(self, columns: list[str], output: str) -> None:
        self.columns = list(columns)
        self.output = output
        self.mean: np.ndarray | None = None
        self.scale: np.ndarray | None = None

    @property
    def inputs(self) -> list[str]:
        return self.columns

    @property
    def outputs(self) -> list[str]:
        return [self.output]

    def _stack(self, columns: Columns) -> np.ndarray:
        self._require(columns)
        return np.stack([np.asarray(columns[c], dtype=np.float32) for c in self.columns], axis=1)

    def partial_fit(self, columns: Columns) -> tuple[int, ExactSums, ExactSums]:
        """Row count, and exact sums of each column's float32 values and of their squares
        (a float32's square is exact in float64)."""
        self._require(columns)
        n = len(self.columns)
        values = [np.asarray(columns[c], dtype=np.float32) for c in self.columns]
        rows = len(values[0]) if values else 0
        sums = [ExactSums.of(j, v, n) for j, v in enumerate(values)]
        squares = [ExactSums.of(j, v, n, squared=True) for j, v in enumerate(values)]
        return rows, ExactSums.merge(sums, n), ExactSums.merge(squares, n)

    def merge(
        self, parts: Sequence[tuple[int, ExactSums, ExactSums]]
    ) -> tuple[int, ExactSums, ExactSums]:
        n = len(self.columns)
        return (
            sum(part[0] for part in parts),
            ExactSums.merge([part[1] for part in parts], n),
            ExactSums.merge([part[2] for part in parts], n),
        )

    def combine(self, parts: Sequence[tuple[int, ExactSums, ExactSums]]) -> None:
        """Mean and population standard deviation from exact sums, each rounded once."""
        rows, merged_sums, merged_squares = self.merge(parts)
        sums, squares = merged_sums.fractions(), merged_squares.fractions()
        if rows == 0:
            raise ValueError(f"{self.kind} needs at least one training row")
        means = [total / rows for total in sums]
        variances = [
            square / rows - mean * mean for square, mean in zip(squares, means, strict=True)
        ]
        self.mean = np.asarray([float(m) for m in means], dtype=np.float32)
        std = np.sqrt(np.asarray([float(v) for v in variances], dtype=np.float64))
        self.scale = np.where(std > 1e-6, std, 1.0).astype(np.float32)

    def transform(self, columns: Columns) -> Columns:
        assert self.mean is not None and self.scale is not None, "fit first"
        return {self.output: ((self._stack(columns) - self.mean) / self.scale).astype(np.float32)}

    def config(self) -> dict[str, Any]:
        return {"columns": self.columns, "output": self.output}

    def arrays(self) -> dict[str, np.ndarray]:
        assert self.mean is not None and self.scale is not None, "fit first"
        return {"mean": self.mean, "scale": self.scale}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.mean = arrays["mean"]
        self.scale = arrays["scale"]
