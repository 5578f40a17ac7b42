"""Bad rows in the files being ingested: the first of each kind, counted, raised as one error
that names the file, the column and an example row."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from core.errors import DataError
from pipelines.data.reader import Batch


def example_row(batch: Batch, position: int) -> str:
    """Row ``position`` of ``batch`` as an error shows it: its number in the file, its values."""
    values = {name: batch.data.column(name)[position].as_py() for name in batch.data.schema.names}
    return f"row {batch.offset + position + 1}: {values}"


@dataclass
class _Problem:
    what: str
    file: Path
    example: str
    count: int = 0


@dataclass
class Problems:
    """The first bad row of each kind of problem, and how many rows have it."""

    found: dict[str, _Problem] = field(default_factory=dict)

    def add(self, what: str, batch: Batch, bad: np.ndarray | None) -> None:
        """Note the rows of ``batch`` where ``bad`` (a boolean mask) holds."""
        if bad is None or not bad.any():
            return
        if what not in self.found:
            self.found[what] = _Problem(what, batch.file, example_row(batch, int(np.argmax(bad))))
        self.found[what].count += int(bad.sum())

    def raise_first(self) -> None:
        if self.found:
            p = next(iter(self.found.values()))
            rows = "1 row" if p.count == 1 else f"{p.count} rows"
            raise DataError(p.file, f"{p.what} ({rows} in all; first at {p.example})")


def missing_mask(values: pa.Array) -> np.ndarray:
    return np.asarray(values.is_null(), dtype=bool)
