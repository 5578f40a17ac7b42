"""The operator contract shared by every feature op.

A batch is a ``Columns`` mapping of column name to numpy array (1-D, or 2-D for multi-hot),
the same shape offline (millions of rows) and online (one user x a few hundred candidates),
so one implementation serves both. Ops are fitted on training rows, then ``transform`` adds
their output columns. State is plain JSON config plus named numpy arrays, so a saved
workflow needs no pickle.

Fitting is statistics from parts, merged: ``partial_fit`` summarises some rows, ``combine``
fits from the summaries of all of them. ``fit`` is the one-part case, and a cluster fits
partitions where they lie and combines their summaries; each op's ``combine`` is exact
(counts, sets, exact float sums), so both give the same fitted op.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from core.errors import ArtifactError

Columns = dict[str, np.ndarray]


class FeatureOp(ABC):
    """A fitted column transform: ``fit`` learns state, ``transform`` adds output columns."""

    kind: ClassVar[str]

    @property
    @abstractmethod
    def inputs(self) -> list[str]:
        """Columns this op reads."""

    @property
    def transform_inputs(self) -> list[str]:
        """Columns ``transform`` needs (``fit`` may need more, e.g. a value to aggregate)."""
        return self.inputs

    @property
    @abstractmethod
    def outputs(self) -> list[str]:
        """Columns this op writes."""

    def fit(self, columns: Columns) -> None:
        """Learn state from training rows."""
        self.combine([self.partial_fit(columns)])

    @abstractmethod
    def partial_fit(self, columns: Columns) -> Any:
        """A summary of these training rows (picklable), for ``combine``."""

    @abstractmethod
    def merge(self, parts: Sequence[Any]) -> Any:
        """One summary of the rows of ``parts`` (``partial_fit`` summaries, or merged ones):
        what a stream of parts keeps instead of every part's summary."""

    @abstractmethod
    def combine(self, parts: Sequence[Any]) -> None:
        """Learn state from the ``partial_fit`` summaries of all training rows, in any
        grouping and order."""

    @abstractmethod
    def transform(self, columns: Columns) -> Columns:
        """Return the output columns for these rows (inputs are not modified)."""

    def fit_transform(self, columns: Columns) -> Columns:
        """Fit, then transform the same rows. Ops that would leak the label override this."""
        self.fit(columns)
        return self.transform(columns)

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """Constructor arguments, JSON-serialisable."""

    def arrays(self) -> dict[str, np.ndarray]:
        """Fitted state as named arrays (empty for stateless ops)."""
        return {}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore fitted state saved by ``arrays``."""
        if arrays:
            raise ArtifactError(f"{self.kind} keeps no arrays but {sorted(arrays)} were saved")

    def _require(self, columns: Columns) -> None:
        missing = [c for c in self.inputs if c not in columns]
        if missing:
            raise KeyError(f"{self.kind} needs columns {missing}")


def lookup(table: np.ndarray, index: np.ndarray, default: float) -> np.ndarray:
    """``table[index]`` where index may fall outside the table (then ``default``)."""
    index = np.asarray(index, dtype=np.int64)
    inside = (index >= 0) & (index < len(table))
    out = np.full(index.shape, default, dtype=np.float32)
    out[inside] = table[index[inside]]
    return out


class MeanTableOp(FeatureOp):
    """An op whose fitted state is a per-id table of means and a global prior."""

    means: np.ndarray | None = None
    prior: float = 0.0

    def arrays(self) -> dict[str, np.ndarray]:
        assert self.means is not None, "fit first"
        return {"means": self.means, "prior": np.asarray([self.prior])}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.means = arrays["means"]
        self.prior = float(arrays["prior"][0])
