"""Splits of all interactions into train / valid / test, shared by every model.

``random_split`` is the default evaluation protocol of ``cascade train`` (random 8:1:1 of all
interactions); ``per_user_split`` cuts each user's interactions 8:1:1 at random
(``--split-protocol per_user``);
``time_split`` cuts by time: the oldest rows train, the next window validates, the most
recent window tests; ``holdout_split`` is what ``cascade retrain`` uses: the most recent
window minus what production learnt is the test set (the validation gate's holdout), so
candidate and production are judged on rows neither learnt from, and every older row is
the candidate's to learn from.

One split of all interactions serves both protocols: retrieval keeps rating >= 3 as
positives inside each part, ranking drops rating == 3 inside each part. So no row that a
ranking model is tested on was seen by the retrieval model in training, and vice versa.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from core.errors import ConfigError

POSITIVE_RATING = 3.0  # retrieval: rating >= 3 is a positive


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


def per_user_split(
    user_ids: np.ndarray, seed: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
) -> Split:
    """Random ``fractions`` of each user's rows (the per-user protocol of most published
    MovieLens results): a user with n rows gets ``round(0.1 n)`` (at least one when n >= 3)
    in validation and in test, so every such user is evaluated."""
    _check_fractions(fractions)
    users = np.asarray(user_ids)
    rng = np.random.default_rng(seed)
    order = np.lexsort((rng.random(len(users)), users))  # each user's rows, randomly ordered
    sorted_users = users[order]
    starts = np.r_[0, np.flatnonzero(sorted_users[1:] != sorted_users[:-1]) + 1]
    counts = np.diff(np.r_[starts, len(users)])
    rank = np.arange(len(users)) - np.repeat(starts, counts)  # position within the user
    n = np.repeat(counts, counts)
    n_valid = np.round(fractions[1] * n).astype(np.int64)
    n_test = np.round(fractions[2] * n).astype(np.int64)
    enough = n >= 3
    n_valid = np.where(enough & (fractions[1] > 0), np.maximum(n_valid, 1), n_valid)
    n_test = np.where(enough & (fractions[2] > 0), np.maximum(n_test, 1), n_test)
    in_test = rank < n_test
    in_valid = ~in_test & (rank < n_test + n_valid)
    in_train = ~in_test & ~in_valid
    return Split(
        train=np.sort(order[in_train]),
        valid=np.sort(order[in_valid]),
        test=np.sort(order[in_test]),
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


def judged_window(
    timestamps: np.ndarray, served: np.ndarray, fractions: tuple[float, float, float]
) -> np.ndarray:
    """Positions of the newest ``fractions[2]`` of the rows that are not ``served``."""
    judged = np.flatnonzero(~np.asarray(served, dtype=bool))
    return judged[time_split(np.asarray(timestamps)[judged], fractions).test]


def holdout_split(
    timestamps: np.ndarray,
    learnt: np.ndarray,
    served: np.ndarray | None = None,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    seed: int = 0,
) -> Split:
    """The retrain's split.

    The window is the newest ``fractions[2]`` of the rows a gate may judge (all rows but
    the ``served`` ones: rows derived from answers the serving models chose, biased towards
    them); test is the window minus the rows production ``learnt`` from. The served rows
    from the window's start on that production did not learn are in no part: never judged,
    and not trained on (nothing newer than the holdout is). Every other row (older ones,
    and what production learnt) is the candidate's, ``fractions[1] / (fractions[0] +
    fractions[1])`` of them drawn at random (seeded) for validation.

    Why validation is not the newest of the rest: a time-cut validation window holds out
    whole recent users (MovieLens users rate in one burst), whom production, trained on a
    random split, learnt; the candidate then loses to production on exactly the users the
    holdout is made of. What production learnt, the candidate may learn too.
    """
    _check_fractions(fractions)
    learnt = np.asarray(learnt, dtype=bool)
    served = np.zeros(len(learnt), bool) if served is None else np.asarray(served, dtype=bool)
    if learnt.shape != np.shape(timestamps) or served.shape != learnt.shape:
        raise ValueError("learnt and served need one flag per row")
    timestamps = np.asarray(timestamps)
    in_test = np.zeros(len(learnt), dtype=bool)
    window = judged_window(timestamps, served, fractions)
    in_test[window] = True
    in_test &= ~learnt
    held = served & ~learnt
    held &= timestamps >= timestamps[window].min() if len(window) else False
    rest = np.flatnonzero(~in_test & ~held)
    kept = fractions[0] + fractions[1]
    n_valid = round(fractions[1] / kept * len(rest)) if kept > 0 else 0
    order = np.random.default_rng(seed).permutation(rest)
    return Split(
        train=np.sort(order[n_valid:]),
        valid=np.sort(order[:n_valid]),
        test=np.flatnonzero(in_test),
    )


def retrieval_positives(interactions: pd.DataFrame) -> pd.DataFrame:
    """Rows that count as positives for retrieval."""
    return interactions[interactions["rating"] >= POSITIVE_RATING]


def ranking_rows(interactions: pd.DataFrame) -> pd.DataFrame:
    """Rows of the ranking protocol (rating == 3 dropped)."""
    return interactions[interactions["rating"] != POSITIVE_RATING]
