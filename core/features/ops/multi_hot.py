"""Multi-hot encoding of a separator-joined list column (e.g. genres)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from core.features.ops.base import Columns, FeatureOp
from core.features.ops.distinct import distinct


class MultiHot(FeatureOp):
    """A ``[rows, vocabulary]`` float32 matrix, plus the first listed value's id (0 = none)."""

    kind: ClassVar[str] = "multi_hot"

    def __init__(self, column: str, separator: str = "|") -> None:
        self.column = column
        self.separator = separator
        self.vocabulary: np.ndarray | None = None

    @property
    def inputs(self) -> list[str]:
        return [self.column]

    @property
    def outputs(self) -> list[str]:
        return [f"{self.column}_multi_hot", f"{self.column}_first_idx"]

    def partial_fit(self, columns: Columns) -> set[str]:
        """The listed names found in these rows."""
        self._require(columns)
        values = np.asarray(columns[self.column], dtype=object)
        found = distinct(values)
        texts = (values if found is None else found[0]).astype(str)
        return {name for joined in np.unique(texts) for name in joined.split(self.separator)}

    def merge(self, parts: Sequence[set[str]]) -> set[str]:
        return set().union(*parts)

    def combine(self, parts: Sequence[set[str]]) -> None:
        names = self.merge(parts)
        self.vocabulary = np.asarray(sorted(name for name in names if name), dtype=str)

    def transform(self, columns: Columns) -> Columns:
        self._require(columns)
        assert self.vocabulary is not None, "fit first"
        values = np.asarray(columns[self.column], dtype=object)
        # Few distinct lists exist (combinations of genres): encode each once, then gather.
        found = distinct(values)
        if found is None:
            uniques, inverse = np.unique(values.astype(str), return_inverse=True)
        else:
            uniques, inverse = found[0].astype(str), found[1]
        table = np.zeros((len(uniques), len(self.vocabulary)), dtype=np.float32)
        first = np.zeros(len(uniques), dtype=np.int64)
        index = {name: i for i, name in enumerate(self.vocabulary.tolist())}
        for row, joined in enumerate(uniques.tolist()):
            names = [n for n in joined.split(self.separator) if n in index]
            table[row, [index[n] for n in names]] = 1.0
            first[row] = index[names[0]] + 1 if names else 0
        inverse = inverse.reshape(-1)
        return {self.outputs[0]: table[inverse], self.outputs[1]: first[inverse]}

    def config(self) -> dict[str, Any]:
        return {"column": self.column, "separator": self.separator}

    def arrays(self) -> dict[str, np.ndarray]:
        assert self.vocabulary is not None, "fit first"
        return {"vocabulary": self.vocabulary}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.vocabulary = arrays["vocabulary"]
