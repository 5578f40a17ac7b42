"""Multi-hot encoding of a separator-joined list column (e.g. genres)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pipelines.features.ops.base import Columns, FeatureOp


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

    def _split(self, values: np.ndarray) -> list[list[str]]:
        return [str(v).split(self.separator) if v else [] for v in np.asarray(values, dtype=object)]

    def fit(self, columns: Columns) -> None:
        self._require(columns)
        uniques = np.unique(np.asarray(columns[self.column], dtype=object).astype(str))
        names = {name for joined in uniques for name in joined.split(self.separator) if name}
        self.vocabulary = np.asarray(sorted(names), dtype=str)

    def transform(self, columns: Columns) -> Columns:
        self._require(columns)
        assert self.vocabulary is not None, "fit first"
        values = np.asarray(columns[self.column], dtype=object).astype(str)
        # Few distinct lists exist (combinations of genres): encode each once, then gather.
        uniques, inverse = np.unique(values, return_inverse=True)
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
