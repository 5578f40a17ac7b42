from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipelines.data.synthetic import GENRES, make_synthetic
from pipelines.errors import ConfigError


def test_same_seed_same_data_other_seed_other_data() -> None:
    a, b = make_synthetic(200, 300, 5_000, seed=1), make_synthetic(200, 300, 5_000, seed=1)
    c = make_synthetic(200, 300, 5_000, seed=2)
    pd.testing.assert_frame_equal(a.interactions, b.interactions)
    pd.testing.assert_frame_equal(a.items, b.items)
    assert not a.interactions.equals(c.interactions)
    assert a.content_hash() == b.content_hash() != c.content_hash()


def test_schema_and_sizes() -> None:
    data = make_synthetic(100, 1_000, 20_000, seed=0)
    assert (len(data.users), len(data.items), len(data.interactions)) == (100, 1_000, 20_000)
    assert data.interactions["user_id"].between(1, 100).all()
    assert data.interactions["item_id"].between(1, 1_000).all()
    assert data.interactions["rating"].isin([1, 2, 3, 4, 5]).all()
    genres = {g for joined in data.items["genres"] for g in joined.split("|")}
    assert genres <= set(GENRES)
    assert (
        data.interactions["timestamp"].is_monotonic_increasing is False
    )  # not sorted: random times


def test_item_popularity_is_heavy_tailed() -> None:
    data = make_synthetic(2_000, 10_000, 200_000, seed=0)
    counts = np.sort(data.interactions["item_id"].value_counts().to_numpy())[::-1]
    top_one_percent = counts[: len(counts) // 100].sum() / counts.sum()
    assert top_one_percent > 0.3  # a uniform catalog would give ~0.01


@pytest.mark.parametrize("sizes", [(0, 10, 10), (10, 0, 10), (10, 10, 0)])
def test_empty_sizes_are_rejected(sizes: tuple[int, int, int]) -> None:
    with pytest.raises(ConfigError, match="must all be >= 1"):
        make_synthetic(*sizes)
