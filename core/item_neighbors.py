"""Item-to-item neighbours as serving reads them: the saved table, a user's candidates from
their recent history, and the merge of those candidates with the ANN's.

The table is built offline (``pipelines/training/item_neighbors.py``); both sides share this
reader, so the format is defined once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

DIRECTORY = "item_neighbors"  # neighbors.npy and similarity.npy (memory-mappable)
# Of a request's candidates, how many the neighbour source gives beside the ANN by default:
# none, since adding neighbours to the ANN's candidates did not raise candidate recall
# (docs/benchmarks/cascade_train.md). It pays as the fallback when the query tower cannot
# answer.
DEFAULT_SHARE = 0


def merge_candidates(ann: np.ndarray, extra: np.ndarray, budget: int) -> tuple[np.ndarray, int]:
    """Candidate positions from two sources within ``budget``: the ANN's (best first), then
    the ``extra`` source's that the ANN did not find, which take the last places (at most
    ``len(extra)`` of them). Returns the positions and how many of them are the ANN's."""
    extra = extra[~np.isin(extra, ann)][:budget]
    kept = min(len(ann), budget - len(extra))
    return np.concatenate([ann[:kept], extra]).astype(np.int64), kept


@dataclass
class ItemNeighbors:
    neighbors: np.ndarray  # [n_items, width] int32 item positions, best first; -1 = none
    similarity: np.ndarray  # [n_items, width] float32, descending; 0 where there is none

    @property
    def n_items(self) -> int:
        return len(self.neighbors)

    def candidates(
        self, history: np.ndarray, count: int, exclude: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``count`` best items for a user whose recent items are ``history`` (positions;
        out-of-range ones ignored), best first, with their summed similarities. Neither the
        history's items nor those in ``exclude`` (what the user has seen) are returned."""
        history = np.asarray(history, dtype=np.int64)
        history = history[(history >= 0) & (history < self.n_items)]
        if count <= 0 or len(history) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        found = self.neighbors[history].ravel()
        weights = self.similarity[history].ravel()
        keep = (found >= 0) & ~np.isin(found, history)
        if exclude is not None and len(exclude):
            keep &= ~np.isin(found, exclude)
        items, inverse = np.unique(found[keep], return_inverse=True)
        scores = np.bincount(inverse, weights=weights[keep], minlength=len(items))
        if len(items) > count:
            best = np.argpartition(-scores, count - 1)[:count]
            items, scores = items[best], scores[best]
        order = np.lexsort((items, -scores))  # ties: the lower position first (deterministic)
        return items[order].astype(np.int64), scores[order].astype(np.float32)

    def top(self, history: np.ndarray, seen: np.ndarray, k: int) -> np.ndarray:
        """The ``k`` items a full ranking of ``scores`` puts first for this history, without
        scoring the catalog: the scored items (``candidates``), then the unscored ones from
        the lowest position up (a full ranking's ties). ``seen`` (excluded) holds the
        history wherever this is used: the history is made of training positives."""
        items, _ = self.candidates(history, k, seen)
        missing = k - len(items)
        if missing <= 0:
            return items
        taken = np.concatenate([np.asarray(seen, np.int64), items, np.asarray(history, np.int64)])
        head = np.arange(min(self.n_items, missing + len(taken)))
        return np.concatenate([items, head[~np.isin(head, taken)][:missing]])

    def scores(self, histories: list[np.ndarray]) -> np.ndarray:
        """``[len(histories), n_items]`` summed similarities (for full-ranking evaluation)."""
        out = np.zeros((len(histories), self.n_items), dtype=np.float32)
        for row, history in enumerate(histories):
            history = np.asarray(history, dtype=np.int64)
            found = self.neighbors[history].ravel()
            keep = found >= 0
            np.add.at(out[row], found[keep], self.similarity[history].ravel()[keep])
        return out

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / "neighbors.npy", self.neighbors.astype(np.int32))
        np.save(directory / "similarity.npy", self.similarity.astype(np.float32))

    @classmethod
    def load(cls, directory: Path, mmap: bool = False) -> ItemNeighbors:
        """Read a saved table; ``mmap``: map it instead (serving reads a few rows a request;
        at 1M items x 50 the table is 400 MB)."""
        mode: Literal["r"] | None = "r" if mmap else None
        neighbors = np.load(directory / "neighbors.npy", mmap_mode=mode, allow_pickle=False)
        similarity = np.load(directory / "similarity.npy", mmap_mode=mode, allow_pickle=False)
        if (
            neighbors.shape != similarity.shape
            or neighbors.ndim != 2
            or neighbors.dtype != np.int32
            or similarity.dtype != np.float32
        ):
            raise ValueError(
                f"{directory}: neighbors {neighbors.shape} {neighbors.dtype} and similarity "
                f"{similarity.shape} {similarity.dtype} must be [items, width] int32 and float32"
            )
        return cls(neighbors, similarity)
