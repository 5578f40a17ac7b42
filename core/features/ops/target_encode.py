"""Target encoding, computed out of fold on the training rows so no row sees its own label."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from core.features.ops.base import Columns, MeanTableOp, lookup
from core.features.ops.exact_sum import ExactSums


def _blend(sums: np.ndarray, counts: np.ndarray, prior: float, smoothing: float) -> np.ndarray:
    """``(sum + smoothing * prior) / (count + smoothing)``; ids with no weight get the prior."""
    weight = counts + smoothing
    means = np.divide(
        sums + smoothing * prior, weight, out=np.full(len(sums), prior), where=weight > 0
    )
    return means.astype(np.float32)


@dataclass(frozen=True)
class _Summary:
    """``partial_fit`` of some rows: target sums and row counts by ``id * folds + fold``."""

    sums: ExactSums
    counts: np.ndarray
    folded: bool


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
        self._out_of_fold: list[np.ndarray] | None = None  # per fold, after a folded combine

    @property
    def inputs(self) -> list[str]:
        return [self.column]

    @property
    def outputs(self) -> list[str]:
        return [f"{self.column}_te_{self.target}"]

    def draw_folds(self, generator: np.random.Generator, rows: int) -> np.ndarray:
        """The folds of the next ``rows`` training rows, from ``fold_generator()``: drawn in
        row order, part after part, they are the draws of all rows at once."""
        return generator.integers(0, self.folds, rows).astype(np.int8)

    def fold_generator(self) -> np.random.Generator:
        """The seeded generator ``draw_folds`` draws from, first row first."""
        return np.random.default_rng(self.seed)

    def partial_fit(self, columns: Columns, fold: np.ndarray | None = None) -> _Summary:
        """Exact target sums and row counts per (id, fold) of these rows (``fold``: each
        row's fold from ``draw_folds``; without it every row is in fold 0)."""
        self._require(columns)
        ids = np.asarray(columns[self.column], dtype=np.int64)
        target = np.asarray(columns[self.target], dtype=np.float64)
        size = int(ids.max()) + 1 if len(ids) else 1
        keys = ids * self.folds + (0 if fold is None else np.asarray(fold, dtype=np.int64))
        return _Summary(
            ExactSums.of(keys, target, size * self.folds),
            np.bincount(keys, minlength=size * self.folds),
            fold is not None,
        )

    def merge(self, parts: Sequence[_Summary]) -> _Summary:
        size = max(len(p.counts) for p in parts) // self.folds
        counts = np.zeros(size * self.folds, dtype=np.int64)
        for part in parts:
            counts[: len(part.counts)] += part.counts
        return _Summary(
            ExactSums.merge([p.sums for p in parts], size * self.folds),
            counts,
            all(p.folded for p in parts),
        )

    def combine(self, parts: Sequence[_Summary]) -> None:
        merged = self.merge(parts)
        size = len(merged.counts) // self.folds
        sums = merged.sums
        counts = merged.counts.reshape(size, self.folds)
        self.prior = self._mean(sums, int(counts.sum()), 0.0)
        id_sums = sums.regrouped(sums.keys // self.folds, size).floats()
        self.means = _blend(id_sums, counts.sum(axis=1), self.prior, self.smoothing)
        self._out_of_fold = None
        if merged.folded:  # each fold's table from the other folds' rows
            self._out_of_fold = []
            for k in range(self.folds):
                other = sums.where(sums.keys % self.folds != k)
                outside = np.delete(counts, k, axis=1).sum(axis=1)
                prior = self._mean(other, int(outside.sum()), self.prior)
                other_sums = other.regrouped(other.keys // self.folds, size).floats()
                self._out_of_fold.append(_blend(other_sums, outside, prior, self.smoothing))

    @staticmethod
    def _mean(sums: ExactSums, rows: int, default: float) -> float:
        total = sums.regrouped(np.zeros(len(sums.keys), np.int64), 1).fractions()[0]
        return float(total / rows) if rows else default

    def fit_transform(self, columns: Columns) -> Columns:
        self._require(columns)
        fold = self.draw_folds(self.fold_generator(), len(columns[self.column]))
        self.combine([self.partial_fit(columns, fold)])
        return self.out_of_fold(columns, fold)

    def out_of_fold(self, columns: Columns, fold: np.ndarray) -> Columns:
        """Training rows encoded with the statistics of the other folds only (``fold``: the
        rows' folds given to ``partial_fit`` before ``combine``)."""
        if self._out_of_fold is None:
            raise ValueError("out_of_fold needs a combine of partial_fit summaries with folds")
        ids = np.asarray(columns[self.column], dtype=np.int64)
        out = np.empty(len(ids), dtype=np.float32)
        for k, table in enumerate(self._out_of_fold):
            inside = fold == k
            out[inside] = table[ids[inside]]
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
