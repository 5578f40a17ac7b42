"""Target encoding, computed out of fold on the training rows so no row sees its own label."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from core.features.ops.base import Columns, MeanTableOp, lookup


def _smoothed_means(
    ids: np.ndarray, target: np.ndarray, size: int, prior: float, smoothing: float
) -> np.ndarray:
    sums = np.bincount(ids, weights=target, minlength=size)
    counts = np.bincount(ids, minlength=size)
    return _blend(sums, counts, prior, smoothing)


def _blend(sums: np.ndarray, counts: np.ndarray, prior: float, smoothing: float) -> np.ndarray:
    """``(sum + smoothing * prior) / (count + smoothing)``; ids with no weight get the prior."""
    weight = counts + smoothing
    means = np.divide(
        sums + smoothing * prior, weight, out=np.full(len(sums), prior), where=weight > 0
    )
    return means.astype(np.float32)


class TargetEncode(MeanTableOp):
    """Smoothed mean of ``target`` per id.

    ``fit_transform`` (training rows) assigns rows to ``folds`` random folds and encodes each
    fold with statistics (means and the global prior) of the other folds only; ``transform``
    (validation, test, serving) uses the statistics of all training rows. Unseen ids get the
    global mean.
    """

    kind: ClassVar[str] = "target_encode"

    def __init__(
        self, column: str, target: str, folds: int = 5, smoothing: float = 20.0, seed: int = 0
    ) -> None:
        if folds < 2:
            raise ValueError("target encoding needs at least 2 folds")
        self.column = column
        self.target = target
        self.folds = folds
        self.smoothing = smoothing
        self.seed = seed
        self.means: np.ndarray | None = None
        self.prior = 0.0

    @property
    def inputs(self) -> list[str]:
        return [self.column]

    @property
    def outputs(self) -> list[str]:
        return [f"{self.column}_te_{self.target}"]

    def fit(self, columns: Columns) -> None:
        self._require(columns)
        ids = np.asarray(columns[self.column], dtype=np.int64)
        target = np.asarray(columns[self.target], dtype=np.float64)
        self.prior = float(target.mean()) if len(target) else 0.0
        size = int(ids.max()) + 1 if len(ids) else 1
        self.means = _smoothed_means(ids, target, size, self.prior, self.smoothing)

    def fit_transform(self, columns: Columns) -> Columns:
        self.fit(columns)
        ids = np.asarray(columns[self.column], dtype=np.int64)
        target = np.asarray(columns[self.target], dtype=np.float64)
        size = int(ids.max()) + 1 if len(ids) else 1
        fold = np.random.default_rng(self.seed).integers(0, self.folds, len(ids))
        out = np.empty(len(ids), dtype=np.float32)
        all_sums = np.bincount(ids, weights=target, minlength=size)
        all_counts = np.bincount(ids, minlength=size)
        for k in range(self.folds):
            inside = fold == k
            outside = ~inside
            prior = float(target[outside].mean()) if outside.any() else self.prior
            sums = all_sums - np.bincount(ids[inside], weights=target[inside], minlength=size)
            counts = all_counts - np.bincount(ids[inside], minlength=size)
            out[inside] = _blend(sums, counts, prior, self.smoothing)[ids[inside]]
        return {self.outputs[0]: out}

    def transform(self, columns: Columns) -> Columns:
        self._require(columns)
        assert self.means is not None, "fit first"
        return {self.outputs[0]: lookup(self.means, columns[self.column], self.prior)}

    def config(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "target": self.target,
            "folds": self.folds,
            "smoothing": self.smoothing,
            "seed": self.seed,
        }
