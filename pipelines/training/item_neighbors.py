"""Item-to-item neighbours from co-occurrence: a second retrieval source beside the ANN.

Two items are neighbours when the same users liked both. For each item the table keeps the
``width`` items with the highest cosine of their co-occurrence,
``c(i, j) / sqrt(n(i) * n(j))`` (``c``: users who liked both, ``n``: users who liked one), so
that a popular item is not everyone's neighbour. A user's candidates are the neighbours of
their recent history, each scored by the sum of its similarities to the history's items
(an item-based collaborative filter in the style of Sarwar et al. 2001 and of the
"co-visitation" candidate sources of production recommenders).

The source needs no model call: it also gives a known user personal candidates when the
query tower cannot answer. Each user contributes at most ``items_per_user`` items (a seeded
sample of larger histories), fewer when ``users x items_per_user ** 2`` would pass
``max_pairs``, so that building it stays linear in the data and bounded in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

DIRECTORY = "item_neighbors"  # neighbors.npy and similarity.npy (memory-mappable)
MAX_PAIRS = 40_000_000  # co-occurring pairs counted at most (about 320 MB while building)
# Of a request's candidates, how many the neighbour source gives beside the ANN by default:
# none, since adding neighbours to the ANN's candidates did not raise candidate recall
# (docs/benchmarks/cascade_train.md). It pays as the fallback when the query tower cannot
# answer.
DEFAULT_SHARE = 0
REPORTED_BUDGET = 300  # serving's default candidate count
REPORTED_SHARE = 25


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


def capped_positives(
    pairs: np.ndarray, items_per_user: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(users, items) of ``[n, 2]`` pairs, deduplicated, with at most ``items_per_user`` items
    per user (a seeded random sample of larger sets)."""
    pairs = np.unique(np.asarray(pairs, dtype=np.int64), axis=0)
    if len(pairs) == 0:
        return pairs[:, 0], pairs[:, 1]
    order = np.lexsort((np.random.default_rng(seed).random(len(pairs)), pairs[:, 0]))
    users, items = pairs[order, 0], pairs[order, 1]
    starts = np.r_[0, np.flatnonzero(users[1:] != users[:-1]) + 1]
    rank = np.arange(len(users)) - np.repeat(starts, np.diff(np.r_[starts, len(users)]))
    keep = rank < items_per_user
    return users[keep], items[keep]


def build_item_neighbors(
    positives: np.ndarray,
    n_items: int,
    width: int = 50,
    items_per_user: int = 50,
    seed: int = 0,
    max_pairs: int = MAX_PAIRS,
) -> ItemNeighbors:
    """The neighbour table of ``[n, 2]`` (user position, item position) training positives."""
    if width < 1 or items_per_user < 2:
        raise ValueError(
            f"width must be >= 1 and items_per_user >= 2, got {width} and {items_per_user}"
        )
    active = max(len(np.unique(positives[:, 0])), 1)
    cap = max(2, min(items_per_user, math.isqrt(max_pairs // active)))
    users, items = capped_positives(positives, cap, seed)
    import scipy.sparse as sp  # here: serving imports this module, not the builder

    liked = sp.csr_matrix(
        (np.ones(len(users), np.float32), (users, items)),
        shape=(int(users.max()) + 1 if len(users) else 0, n_items),
    )
    together = (liked.T @ liked).tocsr()  # [n_items, n_items] users who liked both
    together.sum_duplicates()
    counts = np.asarray(together.diagonal(), dtype=np.float64)
    rows = np.repeat(np.arange(n_items), np.diff(together.indptr))
    columns = together.indices.astype(np.int64)
    cosine = together.data / np.sqrt(counts[rows] * counts[columns])
    off_diagonal = rows != columns
    rows, columns, cosine = rows[off_diagonal], columns[off_diagonal], cosine[off_diagonal]
    order = np.lexsort((columns, -cosine, rows))  # per row: most similar first
    rows, columns, cosine = rows[order], columns[order], cosine[order]
    starts = np.searchsorted(rows, np.arange(n_items))
    rank = np.arange(len(rows)) - starts[rows]
    kept = rank < width
    neighbors = np.full((n_items, width), -1, dtype=np.int32)
    similarity = np.zeros((n_items, width), dtype=np.float32)
    neighbors[rows[kept], rank[kept]] = columns[kept]
    similarity[rows[kept], rank[kept]] = cosine[kept]
    return ItemNeighbors(neighbors, similarity)


class NeighborRanking:
    """The neighbour source as an evaluation scorer (a ``DirectRanker``) over users whose
    recent histories are ``histories`` (item positions, by user position)."""

    def __init__(self, neighbors: ItemNeighbors, histories: list[np.ndarray]) -> None:
        self.neighbors = neighbors
        self.histories = histories

    def __call__(self, users: np.ndarray) -> np.ndarray:
        return self.neighbors.scores([self.histories[u] for u in users])

    def top(self, user: int, seen: np.ndarray, k: int) -> np.ndarray:
        return self.neighbors.top(self.histories[user], seen, k)
