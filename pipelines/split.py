"""Splits of all interactions into train / valid / test, shared by every model.

``hashed_split`` is the default evaluation protocol of ``cascade train`` (random 8:1:1 of all
interactions, each row's part drawn from a seeded hash of its key: user, item, timestamp, so
adding or removing a row moves no other row); ``per_user_split`` cuts each user's
interactions 8:1:1 at random (``--split-protocol per_user``; rows ordered by the same hash
within each user, so a row added to one user moves no other user's rows);
``random_split`` is the permutation split of versions exported before
``SPLIT_METHOD`` (kept to reconstruct what they learnt);
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
KEY_COLUMNS = ("user_id", "item_id", "timestamp")  # a row's identity for the hashed split
# Recorded in every export's manifest; versions without it used the seeded permutation.
SPLIT_METHOD = "row-hash-v1"
PERMUTATION = "permutation"


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


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fixed, platform-independent 64-bit mix."""
    z = values.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def _column_bits(values: np.ndarray) -> np.ndarray:
    """64 bits per value: integers and floats as they are, anything else (string ids)
    through pandas' fixed-key hash."""
    if values.dtype.kind in "iub":
        return values.astype(np.int64).view(np.uint64)
    if values.dtype.kind == "f":
        return values.astype(np.float64).view(np.uint64)
    return pd.util.hash_array(values.astype(object), categorize=False)


def row_draws(keys: pd.DataFrame, seed: int) -> np.ndarray:
    """One number in [0, 1) per row, a seeded hash of its ``KEY_COLUMNS``: a row's draw
    depends on that row and the seed only."""
    missing = [c for c in KEY_COLUMNS if c not in keys]
    if missing:
        raise ConfigError(f"the hashed split needs the columns {missing}")
    state = np.full(len(keys), _mix(np.array([seed], dtype=np.int64).view(np.uint64))[0])
    with np.errstate(over="ignore"):
        for column in KEY_COLUMNS:
            state = _mix(state ^ (_mix(_column_bits(keys[column].to_numpy())) + _GOLDEN))
    return (state >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def hashed_split(
    keys: pd.DataFrame, seed: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
) -> Split:
    """Each row to train / valid / test by its ``row_draws``: the parts follow ``fractions``
    in expectation, and a row's part never depends on the other rows."""
    _check_fractions(fractions)
    draws = row_draws(keys, seed)
    in_train = draws < fractions[0]
    in_valid = ~in_train & (draws < fractions[0] + fractions[1])
    return Split(
        train=np.flatnonzero(in_train),
        valid=np.flatnonzero(in_valid),
        test=np.flatnonzero(~in_train & ~in_valid),
    )


def random_split(
    n_rows: int, seed: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
) -> Split:
    """Shuffle row positions with ``seed`` and cut them by ``fractions`` (the split of
    versions exported before ``SPLIT_METHOD``: one row more reshuffles every row)."""
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
    user_ids: np.ndarray,
    seed: int,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    draws: np.ndarray | None = None,
) -> Split:
    """Random ``fractions`` of each user's rows (the per-user protocol of most published
    MovieLens results): a user with n rows gets ``round(0.1 n)`` (at least one when n >= 3)
    in validation and in test, so every such user is evaluated.

    ``draws`` (``row_draws``) order each user's rows; without them a seeded generator does
    (the split of versions exported before ``SPLIT_METHOD``)."""
    _check_fractions(fractions)
    users = np.asarray(user_ids)
    if draws is None:
        draws = np.random.default_rng(seed).random(len(users))
    order = np.lexsort((draws, users))  # each user's rows, randomly ordered
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
    keys: pd.DataFrame | None = None,
) -> Split:
    """The retrain's split.

    The window is the newest ``fractions[2]`` of the rows a gate may judge (all rows but
    the ``served`` ones: rows derived from answers the serving models chose, biased towards
    them); test is the window minus the rows production ``learnt`` from. The served rows
    from the window's start on that production did not learn are in no part: never judged,
    and not trained on (nothing newer than the holdout is). Every other row (older ones,
    and what production learnt) is the candidate's, ``fractions[1] / (fractions[0] +
    fractions[1])`` of them drawn for validation by the seeded hash of each row's ``keys``
    (``row_draws``; without ``keys``, of its timestamp), so one row more or less moves no
    other row between training and validation.

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
    rest = ~in_test & ~held
    kept = fractions[0] + fractions[1]
    if keys is None:
        keys = pd.DataFrame({"user_id": 0, "item_id": 0, "timestamp": timestamps})
    elif len(keys) != len(learnt):
        raise ValueError("keys need one row per row")
    in_valid = rest & (row_draws(keys, seed) < (fractions[1] / kept if kept > 0 else 0.0))
    return Split(
        train=np.flatnonzero(rest & ~in_valid),
        valid=np.flatnonzero(in_valid),
        test=np.flatnonzero(in_test),
    )


def retrieval_positives(interactions: pd.DataFrame) -> pd.DataFrame:
    """Rows that count as positives for retrieval."""
    return interactions[interactions["rating"] >= POSITIVE_RATING]


def ranking_rows(interactions: pd.DataFrame) -> pd.DataFrame:
    """Rows of the ranking protocol (rating == 3 dropped)."""
    return interactions[interactions["rating"] != POSITIVE_RATING]
