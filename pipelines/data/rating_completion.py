"""A low-rank completion of a rating matrix: what a user would rate an item they never rated.

The traffic simulator's ground truth for MovieLens (``control.simulator.Preferences``):
the served release filters every item a user rated, so the users' own ratings say nothing
about anything they are shown; this completion does. It is fitted on *all* ratings (the
held-out ones too) and never seen by a trained model, like the synthetic generator's latent
affinity.

Biased matrix factorisation, ``rating ~ mean + b_user + b_item + p_user . q_item``, fitted by
alternating ridge regressions on the observed ratings only (seeded, a few seconds at most
for MovieLens-100K).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class RatingCompletion:
    """Fitted factors; ``predict`` takes raw ids (ids the ratings never named get the mean)."""

    user_ids: np.ndarray  # sorted raw ids, one per row of user_factors
    item_ids: np.ndarray
    mean: float
    user_bias: np.ndarray
    item_bias: np.ndarray
    user_factors: np.ndarray
    item_factors: np.ndarray

    def predict(self, user_ids: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
        users, items = np.broadcast_arrays(
            np.asarray(user_ids, np.int64), np.asarray(item_ids, np.int64)
        )
        u, known_u = _lookup(self.user_ids, users)
        i, known_i = _lookup(self.item_ids, items)
        out = np.full(users.shape, self.mean, np.float64)
        out += np.where(known_u, self.user_bias[u], 0.0) + np.where(known_i, self.item_bias[i], 0.0)
        both = known_u & known_i
        out[both] += np.einsum("ij,ij->i", self.user_factors[u[both]], self.item_factors[i[both]])
        return out


def _lookup(ids: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    position = np.clip(np.searchsorted(ids, wanted), 0, max(len(ids) - 1, 0))
    return position, (ids[position] == wanted) if len(ids) else np.zeros(wanted.shape, bool)


def _ridge(
    entity: np.ndarray,
    n_entities: int,
    other_factors: np.ndarray,
    residual: np.ndarray,
    regularisation: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Per entity, the ridge solution of ``residual ~ other_factors . p + b`` over its ratings."""
    design = np.c_[other_factors, np.ones(len(residual))]
    width = design.shape[1]
    order = np.argsort(entity, kind="stable")
    bounds = np.searchsorted(entity[order], np.arange(n_entities + 1))
    solved = np.zeros((n_entities, width))
    penalty = regularisation * np.eye(width)
    for e in range(n_entities):  # a few thousand small solves per sweep
        rows = order[bounds[e] : bounds[e + 1]]
        if len(rows):
            a = design[rows]
            solved[e] = np.linalg.solve(a.T @ a + penalty, a.T @ residual[rows])
    return solved[:, :-1], solved[:, -1]


def fit_rating_completion(
    interactions: pd.DataFrame,
    rank: int = 16,
    regularisation: float = 15.0,
    sweeps: int = 15,
    seed: int = 0,
) -> RatingCompletion:
    """Fit the completion on ``interactions`` (user_id, item_id, rating)."""
    user_ids = np.unique(interactions["user_id"].to_numpy(np.int64))
    item_ids = np.unique(interactions["item_id"].to_numpy(np.int64))
    u = np.searchsorted(user_ids, interactions["user_id"].to_numpy(np.int64))
    i = np.searchsorted(item_ids, interactions["item_id"].to_numpy(np.int64))
    rating = interactions["rating"].to_numpy(np.float64)
    mean = float(rating.mean()) if len(rating) else 0.0
    rng = np.random.default_rng(seed)
    p = rng.normal(0, 0.1, (len(user_ids), rank))
    q = rng.normal(0, 0.1, (len(item_ids), rank))
    b_user, b_item = np.zeros(len(user_ids)), np.zeros(len(item_ids))
    for _ in range(sweeps):
        p, b_user = _ridge(u, len(user_ids), q[i], rating - mean - b_item[i], regularisation)
        q, b_item = _ridge(i, len(item_ids), p[u], rating - mean - b_user[u], regularisation)
    return RatingCompletion(user_ids, item_ids, mean, b_user, b_item, p, q)
