"""Standardise dense columns to zero mean, unit variance (fitted on training rows)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from core.features.ops.base import Columns, FeatureOp


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

    def fit(self, columns: Columns) -> None:
        matrix = self._stack(columns)
        self.mean = matrix.mean(axis=0)
        std = matrix.std(axis=0)
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
