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

import numpy as np

from core.item_neighbors import ItemNeighbors

MAX_PAIRS = 40_000_000  # co-occurring pairs counted at most (about 320 MB while building)
REPORTED_BUDGET = 300  # serving's default candidate count
REPORTED_SHARE = 25


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
