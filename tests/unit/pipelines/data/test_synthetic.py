from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from core.errors import ConfigError
from pipelines.data.synthetic import GENRES, make_synthetic


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


def _mean_truth_affinity(strength: float) -> float:
    data = make_synthetic(300, 2_000, 30_000, seed=3, preference_strength=strength)
    assert data.truth is not None
    pairs = data.interactions
    return float(data.truth.affinity(pairs["user_id"], pairs["item_id"]).mean())


def test_picks_follow_the_latent_preferences() -> None:
    # without preference a pick's affinity averages 0; with it, users pick items they like
    assert abs(_mean_truth_affinity(0.0)) < 0.05
    assert _mean_truth_affinity(2.0) > 0.8


def test_ratings_stay_mostly_positive_whatever_the_strength() -> None:
    for strength in (0.0, 2.0):
        data = make_synthetic(300, 2_000, 30_000, seed=3, preference_strength=strength)
        assert 0.75 < float((data.interactions["rating"] >= 3).mean()) < 0.95


@pytest.mark.parametrize("options", [{"preference_candidates": 0}, {"preference_strength": -1}])
def test_bad_preference_options_are_rejected(options: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="preference_"):
        make_synthetic(10, 10, 10, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "weights",
    [
        np.array([1.0]),
        np.array([0.5, 0.0, 0.0, 0.5]),  # zero-weight items are never drawn
        np.array([0.0, 1.0, 0.0]),
        1.0 / np.arange(1, 5_001) ** 1.1,  # a power law: many light items per guide bucket
        np.random.default_rng(3).random(777),
    ],
)
def test_inverse_cdf_draws_exactly_what_searchsorted_draws(weights: np.ndarray) -> None:
    from pipelines.data.synthetic import InverseCdf

    sampler = InverseCdf(weights)
    u = np.random.default_rng(0).random((4_000, 3))
    u[0, :] = [0.0, np.nextafter(1.0, 0.0), sampler.cdf[0]]  # both ends and an exact edge
    cdf = np.cumsum(weights) / np.cumsum(weights)[-1]
    expected = np.minimum(np.searchsorted(cdf, u, side="right"), len(weights) - 1)
    drawn = sampler.positions(u)
    assert drawn.shape == u.shape
    np.testing.assert_array_equal(drawn, expected)
    assert weights[drawn.ravel()].min() > 0
