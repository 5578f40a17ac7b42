"""Categorify: map raw values to contiguous ids, with null and out-of-vocabulary buckets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from core.features.ops.base import Columns, FeatureOp
from core.features.ops.distinct import MIN_ROWS, distinct

NULL_ID = 0
OOV_ID = 1
FIRST_ID = 2


def _keys(values: np.ndarray, numeric: bool) -> tuple[np.ndarray, np.ndarray]:
    """Normalise raw values to sortable keys and a null mask."""
    values = np.asarray(values)
    if numeric:
        if values.dtype.kind in "OUS":
            text = values.astype(str)
            null = (text == "") | (text == "None") | (text == "nan")  # np.isin: 4x slower
            keys = np.where(null, "nan", text).astype(np.float64)
        else:
            keys = values.astype(np.float64)
        return keys, np.isnan(keys)
    if values.dtype.kind == "O":
        missing = pd.isna(values)
        if missing.any():
            values = np.where(missing, "", values)
    keys = values.astype(str)
    return keys, keys == ""


class Categorify(FeatureOp):
    """Values seen at least ``min_frequency`` times get ids from 2; 0 is null, 1 is OOV.

    Ids are assigned in sorted-value order and looked up with ``np.searchsorted``, so a batch
    of any size is encoded without a Python loop; a large one looks up each distinct value
    once (``distinct``).
    """

    kind: ClassVar[str] = "categorify"

    def __init__(self, column: str, min_frequency: int = 1, numeric: bool = False) -> None:
        if min_frequency < 1:
            raise ValueError("min_frequency must be >= 1")
        self.column = column
        self.min_frequency = min_frequency
        self.numeric = numeric
        self._vocabulary: np.ndarray | None = None
        self._integers: pd.Index | bool | None = None  # see _integer_positions

    @property
    def vocabulary(self) -> np.ndarray | None:
        return self._vocabulary

    @vocabulary.setter
    def vocabulary(self, value: np.ndarray | None) -> None:
        self._vocabulary, self._integers = value, None

    @property
    def inputs(self) -> list[str]:
        return [self.column]

    @property
    def outputs(self) -> list[str]:
        return [f"{self.column}_idx"]

    @property
    def cardinality(self) -> int:
        """Number of ids including the null and OOV buckets."""
        assert self.vocabulary is not None, "fit first"
        return len(self.vocabulary) + FIRST_ID

    def partial_fit(self, columns: Columns) -> tuple[np.ndarray, np.ndarray]:
        """The distinct non-null keys of these rows, sorted, and how often each occurs."""
        self._require(columns)
        values = columns[self.column]
        found = distinct(values, exact_text=not self.numeric)
        if found is None:
            keys, null = _keys(values, self.numeric)
            uniques, counts = np.unique(keys[~null], return_counts=True)
            return uniques, counts.astype(np.int64)
        # the keys of the distinct values, each counted as often as it occurs
        keys, null = _keys(found[0], self.numeric)
        rows = np.bincount(found[1], minlength=len(keys))
        uniques, which = np.unique(keys[~null], return_inverse=True)
        counts = np.bincount(which.reshape(-1), weights=rows[~null], minlength=len(uniques))
        return uniques, counts.astype(np.int64)

    def merge(
        self, parts: Sequence[tuple[np.ndarray, np.ndarray]]
    ) -> tuple[np.ndarray, np.ndarray]:
        if len(parts) == 1:
            return parts[0]
        # every part is sorted (np.unique's, or a merge's): a stable sort (timsort) finds the
        # runs and merges them in linear time, where np.unique would sort from scratch
        keys = np.concatenate([keys for keys, _ in parts])
        order = np.argsort(keys, kind="stable")
        keys, counts = keys[order], np.concatenate([c for _, c in parts]).astype(np.int64)[order]
        if not len(keys):
            return keys, counts
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        return keys[starts], np.add.reduceat(counts, starts)

    def combine(self, parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        uniques, counts = self.merge(parts)
        self.vocabulary = uniques[counts >= self.min_frequency]

    def transform(self, columns: Columns) -> Columns:
        self._require(columns)
        assert self.vocabulary is not None, "fit first"
        values = columns[self.column]
        found = distinct(values, exact_text=not self.numeric)
        if found is None:
            return {self.outputs[0]: self._ids(values)}
        uniques, codes = found
        return {self.outputs[0]: self._ids(uniques)[codes]}

    def _integer_positions(self, values: np.ndarray) -> np.ndarray | None:
        """Vocabulary positions (-1: absent) of integer ``values`` by a hash of the integers,
        when every vocabulary entry is an integer written plainly: the positions their text
        would find, without writing millions of integers as text and searching sorted text
        (an integer id column of a data set). None when that does not hold."""
        if self.numeric or values.dtype.kind not in "iu" or len(values) < MIN_ROWS:
            return None
        if self._integers is None:
            assert self.vocabulary is not None, "fit first"
            try:
                numbers = self.vocabulary.astype(np.int64)
                plain = bool(np.array_equal(numbers.astype(str), self.vocabulary))
            except (ValueError, OverflowError):
                plain = False
            self._integers = pd.Index(numbers) if plain else False
        if self._integers is False:
            return None
        assert isinstance(self._integers, pd.Index)
        return np.asarray(self._integers.get_indexer(values))  # type: ignore[arg-type]

    def _ids(self, values: np.ndarray) -> np.ndarray:
        assert self.vocabulary is not None, "fit first"
        position = self._integer_positions(np.asarray(values))
        if position is not None:
            return np.where(position >= 0, position + FIRST_ID, OOV_ID).astype(np.int64)
        keys, null = _keys(values, self.numeric)
        ids = np.full(keys.shape, OOV_ID, dtype=np.int64)
        if len(self.vocabulary):
            position = np.searchsorted(self.vocabulary, keys)
            position = np.minimum(position, len(self.vocabulary) - 1)
            found = self.vocabulary[position] == keys
            ids[found] = position[found] + FIRST_ID
        ids[null] = NULL_ID
        return ids

    def config(self) -> dict[str, Any]:
        return {"column": self.column, "min_frequency": self.min_frequency, "numeric": self.numeric}

    def arrays(self) -> dict[str, np.ndarray]:
        assert self.vocabulary is not None, "fit first"
        return {"vocabulary": self.vocabulary}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.vocabulary = arrays["vocabulary"]
