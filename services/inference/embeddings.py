"""The lookup interface DLRM scoring uses for its embedding rows.

``InMemoryTables`` holds every exported table in memory (memory-mapped ``.npy``). The
hierarchical cache (device -> host -> Redis) implements the same interface.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.errors import ArtifactError


@dataclass(frozen=True)
class TableSpec:
    """``tables.json`` of an exported ranker: table (sparse column) order, rows, row width."""

    columns: list[str]
    rows: dict[str, int]
    dim: int


def read_table_spec(directory: Path) -> TableSpec:
    """The table spec of the ranker's ``embeddings/`` directory (ArtifactError if missing)."""
    path = directory / "tables.json"
    if not path.is_file():
        raise ArtifactError(f"{path} is missing")
    spec = json.loads(path.read_text())
    columns = list(spec["columns"])
    return TableSpec(columns, {c: int(spec["rows"][c]) for c in columns}, int(spec["dim"]))


class EmbeddingLookup(ABC):
    """Batched lookup of embedding rows for every sparse column."""

    degraded: bool = False  # the last lookup served default rows because a store failed

    @abstractmethod
    def lookup(self, sparse: np.ndarray) -> np.ndarray:
        """``sparse [N, T]`` int64 ids -> ``[N, T, D]`` float32 rows; an id out of its
        table's range gets the all-zero default row."""

    def close(self) -> None:  # noqa: B027 - a no-op unless the lookup holds connections
        """Release connections and threads."""


class InMemoryTables(EmbeddingLookup):
    """All rows of all tables in memory."""

    def __init__(self, tables: list[np.ndarray]) -> None:
        self.tables = tables
        self.dim = tables[0].shape[1]

    @classmethod
    def load(cls, directory: Path) -> InMemoryTables:
        spec = read_table_spec(directory)
        tables = [np.load(directory / f"{c}.npy", mmap_mode="r") for c in spec.columns]
        for column, table in zip(spec.columns, tables, strict=True):
            if table.shape != (spec.rows[column], spec.dim):
                raise ArtifactError(
                    f"{directory / column}.npy has shape {table.shape}, manifest says "
                    f"({spec.rows[column]}, {spec.dim})"
                )
        return cls([np.ascontiguousarray(t) for t in tables])

    def lookup(self, sparse: np.ndarray) -> np.ndarray:
        out = np.empty((sparse.shape[0], len(self.tables), self.dim), dtype=np.float32)
        for j, table in enumerate(self.tables):
            ids = sparse[:, j]
            valid = (ids >= 0) & (ids < len(table))
            np.take(table, np.where(valid, ids, 0), axis=0, out=out[:, j])
            out[~valid, j] = 0.0
        return out
