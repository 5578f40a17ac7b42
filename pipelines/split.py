"""Splits of all interactions into train / valid / test, shared by every model.

``random_split`` is the evaluation protocol of ``cascade train`` (random 8:1:1);
``time_split`` is what ``cascade retrain`` uses: the oldest rows train, the next window
validates (early stopping, blend weight), the most recent window is the test set (the
validation gate's holdout), so a candidate is judged on traffic newer than all it learnt from.

One split of all interactions serves both protocols: retrieval keeps rating >= 3 as
positives inside each part, ranking drops rating == 3 inside each part. So no row that a
ranking model is tested on was seen by the retrieval model in training, and vice versa.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipelines.errors import ConfigError

POSITIVE_RATING = 3.0  # retrieval: rating >= 3 is a positive
LIKED_RATING = 4.0  # ranking: label = rating >= 4, rows with rating == 3 dropped


@dataclass(frozen=True)
class Split:
    """Row positions of each part."""

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray


def _check_fractions(fractions: tuple[float, ...]) -> None:
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ConfigError(
            f"split fractions must be three non-negative numbers summing to 1, got {fractions}"
        )


def random_split(
    n_rows: int, seed: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
) -> Split:
    """Shuffle row positions with ``seed`` and cut them by ``fractions``."""
    _check_fractions(fractions)
    order = np.random.default_rng(seed).permutation(n_rows)
    n_train = round(fractions[0] * n_rows)
    n_valid = round(fractions[1] * n_rows)
    return Split(
        train=np.sort(order[:n_train]),
        valid=np.sort(order[n_train : n_train + n_valid]),
        test=np.sort(order[n_train + n_valid :]),
    )


def time_split(
    timestamps: np.ndarray, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
) -> Split:
    """Order rows by ``timestamps`` (ties keep row order) and cut them by ``fractions``:
    train is the oldest part, test the most recent."""
    _check_fractions(fractions)
    order = np.argsort(np.asarray(timestamps), kind="stable")
    n_rows = len(order)
    n_train = round(fractions[0] * n_rows)
    n_valid = round(fractions[1] * n_rows)
    return Split(
        train=np.sort(order[:n_train]),
        valid=np.sort(order[n_train : n_train + n_valid]),
        test=np.sort(order[n_train + n_valid :]),
    )


def retrieval_positives(interactions: pd.DataFrame) -> pd.DataFrame:
    """Rows that count as positives for retrieval."""
    return interactions[interactions["rating"] >= POSITIVE_RATING]


def ranking_rows(interactions: pd.DataFrame) -> pd.DataFrame:
    """Rows of the ranking protocol (rating == 3 dropped)."""
    return interactions[interactions["rating"] != POSITIVE_RATING]
