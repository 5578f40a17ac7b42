"""Retrieval metrics over full rankings, and ranking metrics (AUC, LogLoss)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from pipelines.threads import all_cores

KS = (10, 20)
SCORES_PER_CHUNK = 1 << 25  # users x items scored at once (128 MB of float32)


def group_positives(pairs: np.ndarray, n_users: int) -> list[np.ndarray]:
    """``[n, 2]`` (user, item) pairs -> per-user sorted arrays of items."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    width = int(pairs[:, 1].max()) + 1 if len(pairs) else 1
    order = np.argsort(pairs[:, 0] * width + pairs[:, 1])  # by user, then item: one key
    users, items = pairs[order, 0], pairs[order, 1]
    bounds = np.searchsorted(users, np.arange(n_users + 1))
    return [items[bounds[u] : bounds[u + 1]] for u in range(n_users)]


def retrieval_metrics(
    score_users: Callable[[np.ndarray], np.ndarray],
    test: np.ndarray,
    seen: np.ndarray,
    n_users: int,
    ks: tuple[int, ...] = KS,
    batch: int = 256,
    max_users: int | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Recall@k and NDCG@k with a full ranking over all items (no sampled negatives).

    Args:
        score_users: user positions ``[b]`` -> scores over every item ``[b, n_items]``.
        test: ``[n, 2]`` held-out positive (user, item) pairs.
        seen: ``[m, 2]`` pairs excluded from the ranking (training and validation items).
        n_users: number of users.
        max_users: evaluate a seeded random sample of this many users (large catalogs).
    """
    truth = group_positives(test, n_users)
    return mean_retrieval(
        score_users, truth, group_positives(seen, n_users), max_users, ks, batch, seed
    )


def mean_retrieval(
    score_users: Callable[[np.ndarray], np.ndarray],
    truth: list[np.ndarray],
    seen: list[np.ndarray],
    max_users: int | None = None,
    ks: tuple[int, ...] = KS,
    batch: int = 256,
    seed: int = 0,
) -> dict[str, float]:
    """``retrieval_metrics`` on positives already grouped per user (``group_positives``)."""
    users = evaluated_users(truth, max_users, seed)
    per_user = per_user_retrieval(score_users, users, truth, seen, ks=ks, batch=batch)
    return {name: float(values.sum()) / max(len(users), 1) for name, values in per_user.items()}


def evaluated_users(
    truth: list[np.ndarray], max_users: int | None = None, seed: int = 0
) -> np.ndarray:
    """The user positions with relevant items; a seeded sample of ``max_users`` of them when
    there are more."""
    users = np.asarray([u for u, items in enumerate(truth) if len(items)], dtype=np.int64)
    if max_users is not None and len(users) > max_users:
        users = np.sort(np.random.default_rng(seed).choice(users, max_users, replace=False))
    return users


@runtime_checkable
class DirectRanker(Protocol):
    """A scorer that can also give one user's top items without scoring the whole catalog
    (popularity: one ranking shared by every user; item neighbours: a few hundred scored
    items). ``top`` returns what a full ranking of its scores returns, ties broken by the
    lower item position; at 1M items a full ranking costs milliseconds a user, ``top``
    microseconds."""

    def __call__(self, users: np.ndarray) -> np.ndarray: ...

    def top(self, user: int, seen: np.ndarray, k: int) -> np.ndarray:
        """The ``k`` best items of ``user`` not in ``seen``, best first."""
        ...


def ranked_tops(
    score_users: Callable[[np.ndarray], np.ndarray],
    users: np.ndarray,
    seen: list[np.ndarray],
    k: int,
    batch: int = 256,
) -> Iterator[tuple[int, np.ndarray]]:
    """Each of ``users`` (in order) with its ``k`` best-scored items not in ``seen``, best
    first; at most ``SCORES_PER_CHUNK`` users x items scores at a time (a ``DirectRanker``
    ranks each user directly)."""
    if isinstance(score_users, DirectRanker):
        for u in users.tolist():
            yield u, score_users.top(u, seen[u], k)
        return
    start, block = 0, 1  # the first block (one user) tells the catalog's width
    while start < len(users):
        chunk = users[start : start + block]
        scores = np.array(score_users(chunk), dtype=np.float32, copy=True)
        block = max(1, min(batch, SCORES_PER_CHUNK // max(scores.shape[1], 1)))
        for row, u in enumerate(chunk):
            scores[row, seen[u]] = -np.inf
        # torch.topk on every core: the fastest top-k of a 1M-item row that was measured
        # (docs/benchmarks/code-notes.md)
        with all_cores():
            best = torch.topk(torch.from_numpy(scores), min(k, scores.shape[1]), dim=1)
        yield from zip(chunk.tolist(), best.indices.numpy(), strict=True)
        start += len(chunk)


def per_user_retrieval(
    score_users: Callable[[np.ndarray], np.ndarray],
    users: np.ndarray,
    truth: list[np.ndarray],
    seen: list[np.ndarray],
    ks: tuple[int, ...] = KS,
    batch: int = 256,
    relevant: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Recall@k and NDCG@k of each of ``users`` (full ranking), for paired comparisons.

    Args:
        score_users: user positions ``[b]`` -> scores over every item ``[b, n_items]``.
        users: the user positions to evaluate (each with at least one relevant item).
        truth: per user position, the item positions that are relevant.
        seen: per user position, item positions excluded from the ranking.
        relevant: per user position, how many items are relevant (default ``len(truth[u])``);
            larger when some relevant items cannot be ranked at all (not in the catalog), so
            they count as misses.

    Returns:
        ``{"recall@k": [len(users)], "ndcg@k": [len(users)]}`` in the order of ``users``.
    """
    k_max = max(ks)
    discounts = 1.0 / np.log2(np.arange(2, k_max + 2))
    out = {f"{m}@{k}": np.zeros(len(users)) for k in ks for m in ("recall", "ndcg")}
    for i, (u, top) in enumerate(ranked_tops(score_users, users, seen, k_max, batch)):
        count = len(truth[u]) if relevant is None else int(relevant[u])
        hits = np.isin(top, truth[u])
        for k in ks:
            ideal = discounts[: min(count, k)].sum()
            out[f"recall@{k}"][i] = hits[:k].sum() / count
            out[f"ndcg@{k}"][i] = (hits[:k] * discounts[: len(hits[:k])]).sum() / ideal
    return out


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties)."""
    labels = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both positive and negative labels")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = np.asarray(scores)[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    _, starts, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = starts + (counts + 1) / 2.0
    ranks[order] = np.repeat(average, counts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def logloss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), eps, 1 - eps)
    y = np.asarray(labels, dtype=np.float64)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))
