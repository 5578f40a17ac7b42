"""Paired bootstrap confidence intervals of (candidate - production), resampling users.

Both models are scored on the same holdout; one resample draws holdout users with
replacement and weighs every user's values (a retrieval metric per user, or the ranking
rows of the user) by how often the user was drawn, for both models at once (paired). So the
interval reflects the variation between users, and rows of one user are never treated as
independent. Vectorised: a block of resamples is one ``[resamples, users]`` count matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from pipelines.evaluation.metrics import logloss, sigmoid

CELLS_PER_BLOCK = 20_000_000  # resamples x rows held at once (float64: 160 MB)


@dataclass(frozen=True)
class Interval:
    """Point estimate and two-sided interval of the relative difference."""

    candidate: float
    production: float
    relative: float
    low: float
    high: float


def user_counts(
    rng: np.random.Generator, n_users: int, resamples: int, block: int
) -> Iterator[np.ndarray]:
    """Blocks of ``[b, n_users]`` draw counts, ``resamples`` rows in all."""
    for start in range(0, resamples, block):
        b = min(block, resamples - start)
        drawn = rng.integers(0, n_users, (b, n_users)) + (np.arange(b) * n_users)[:, None]
        yield np.bincount(drawn.ravel(), minlength=b * n_users).reshape(b, n_users)


def relative_difference(candidate: np.ndarray, production: np.ndarray, lower_is_better: bool):
    """(candidate - production) / production, sign flipped when lower is better; a zero
    production value gives +inf when the candidate is better, 0 when equal."""
    candidate, production = np.asarray(candidate, float), np.asarray(production, float)
    gain = production - candidate if lower_is_better else candidate - production
    with np.errstate(divide="ignore", invalid="ignore"):
        out = gain / np.abs(production)
    return np.where(
        production == 0, np.where(gain > 0, np.inf, np.where(gain < 0, -np.inf, 0.0)), out
    )


def weighted_auc(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUC of each row of ``weights [b, n]`` (Mann-Whitney with ties counted half)."""
    order = np.argsort(scores, kind="mergesort")
    ordered = np.asarray(scores)[order]
    positive = np.asarray(labels, bool)[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    w = weights[:, order]
    pos = np.add.reduceat(np.where(positive, w, 0), starts, axis=1)
    neg = np.add.reduceat(np.where(positive, 0, w), starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg
    with np.errstate(divide="ignore", invalid="ignore"):
        return (pos * (below + 0.5 * neg)).sum(1) / (pos.sum(1) * neg.sum(1))


def weighted_logloss(labels: np.ndarray, logits: np.ndarray, weights: np.ndarray) -> np.ndarray:
    p = np.clip(sigmoid(logits), 1e-7, 1 - 1e-7)
    y = np.asarray(labels, float)
    loss = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    return (weights @ loss) / weights.sum(1)


def _interval(
    point: tuple[float, float],
    replicate: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    n_users: int,
    lower_is_better: bool,
    resamples: int,
    confidence: float,
    seed: int,
    cells: int,
) -> Interval:
    rng = np.random.default_rng(seed)
    block = max(1, CELLS_PER_BLOCK // max(cells, 1))
    differences = []
    for counts in user_counts(rng, n_users, resamples, block):
        candidate, production = replicate(counts)
        differences.append(relative_difference(candidate, production, lower_is_better))
    values = np.concatenate(differences)
    values = values[~np.isnan(values)]
    alpha = (1 - confidence) / 2
    low, high = (
        (float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha)))
        if len(values)
        else (float("nan"), float("nan"))
    )
    relative = float(relative_difference(np.array(point[0]), np.array(point[1]), lower_is_better))
    return Interval(point[0], point[1], relative, low, high)


def paired_user_metric(
    candidate: np.ndarray,
    production: np.ndarray,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Interval of the relative difference of a per-user metric's mean (higher is better)."""
    n = len(candidate)
    if n == 0 or len(production) != n:
        raise ValueError("paired values need the same, non-zero number of users")

    def replicate(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return counts @ candidate / n, counts @ production / n

    point = (float(np.mean(candidate)), float(np.mean(production)))
    return _interval(point, replicate, n, False, resamples, confidence, seed, n)


def paired_ranking_metric(
    metric: str,
    labels: np.ndarray,
    candidate_logits: np.ndarray,
    production_logits: np.ndarray,
    row_users: np.ndarray,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Interval of the relative difference of ``auc`` or ``logloss`` over rows, resampling
    the users the rows belong to (``row_users``: any ids)."""
    from pipelines.evaluation.metrics import auc

    _, user_index = np.unique(row_users, return_inverse=True)
    n_users = int(user_index.max()) + 1 if len(user_index) else 0
    if n_users == 0:
        raise ValueError("no ranking rows")
    one: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    if metric == "auc":
        one = weighted_auc
        point = (auc(labels, candidate_logits), auc(labels, production_logits))
    elif metric == "logloss":
        one = weighted_logloss
        point = (
            logloss(labels, sigmoid(candidate_logits)),
            logloss(labels, sigmoid(production_logits)),
        )
    else:
        raise ValueError(f"unknown ranking metric {metric!r}")

    def replicate(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        weights = counts[:, user_index].astype(np.float64)
        return one(labels, candidate_logits, weights), one(labels, production_logits, weights)

    return _interval(
        point, replicate, n_users, metric == "logloss", resamples, confidence, seed, len(labels)
    )
