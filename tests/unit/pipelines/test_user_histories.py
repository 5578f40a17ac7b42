"""``user_histories``: each user's distinct items and last positives, built from offsets,
equal to the per-user computation it replaced (kept here as the reference)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipelines.prepare import user_histories
from pipelines.split import POSITIVE_RATING


def reference(interactions: pd.DataFrame, history_length: int) -> dict[int, tuple[list, list]]:
    ordered = interactions.sort_values(["user_id", "timestamp"], kind="stable")
    out = {}
    for user, rows in ordered.groupby("user_id", sort=True):
        liked = rows[rows["rating"] >= POSITIVE_RATING]["item_id"].to_numpy()
        out[int(user)] = (
            np.unique(rows["item_id"].to_numpy()).tolist(),
            liked[-history_length:].tolist(),
        )
    return out


@pytest.mark.parametrize(("history_length", "wide"), [(1, False), (3, False), (50, True)])
def test_equal_to_the_per_user_computation(history_length: int, wide: bool) -> None:
    """``wide``: values too far apart for one int64 key per pair (the lexsort way)."""
    rng = np.random.default_rng(history_length)
    n = 5_000
    interactions = pd.DataFrame(
        {
            "user_id": rng.integers(1, 300, n),
            "item_id": rng.integers(1, 80, n),  # repeats within a user
            "timestamp": rng.integers(0, 50, n),  # ties within a user: row order decides
            "rating": rng.integers(1, 6, n).astype(np.float32),
        }
    )
    if wide:
        interactions["timestamp"] *= 1 << 56
        interactions["item_id"] *= 1 << 56
    interactions.loc[interactions["user_id"] == 7, "rating"] = 1.0  # a user with no positive
    table = user_histories(interactions, history_length)
    got = {
        u: (s, r)
        for u, s, r in zip(
            table["user_id"].to_pylist(),
            table["seen"].to_pylist(),
            table["recent"].to_pylist(),
            strict=True,
        )
    }
    assert table["user_id"].to_pylist() == sorted(got)
    assert got == reference(interactions, history_length)
    assert got[7][1] == []


def test_no_interactions_give_an_empty_table() -> None:
    empty = pd.DataFrame({"user_id": [], "item_id": [], "timestamp": [], "rating": []}).astype(
        {"user_id": np.int64, "item_id": np.int64, "timestamp": np.int64}
    )
    table = user_histories(empty, 5)
    assert table.num_rows == 0 and table.column_names == ["user_id", "seen", "recent"]
