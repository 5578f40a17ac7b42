"""A synthetic dataset in the MovieLens schema, at any size, deterministic for a seed.

Item popularity and user activity follow power laws (Zipf-like weights), every item has a
release year and one to three genres. A hidden user/item affinity (``LatentTruth``) drives
both *which* items a user picks and how they rate them: each interaction draws
``preference_candidates`` items by popularity and keeps one with probability proportional to
``exp(preference_strength * affinity)`` (a sampling-importance-resampling draw from
``popularity x exp(strength x affinity)``), so that a model that learns the latent structure
beats popularity on held-out picks. Ratings centre the chosen items' affinity, so about 85%
are >= 3 whatever the strength. Built with vectorised numpy in chunks (bounded memory).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from core.errors import ConfigError
from pipelines.data.schema import GENRE_SEPARATOR, LatentTruth, RawDataset

GENRES = (
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
)
OCCUPATIONS = (
    "administrator",
    "artist",
    "doctor",
    "educator",
    "engineer",
    "entertainment",
    "executive",
    "healthcare",
    "homemaker",
    "lawyer",
    "librarian",
    "marketing",
    "none",
    "other",
    "programmer",
    "retired",
    "salesman",
    "scientist",
    "student",
    "technician",
    "writer",
)
_START_TS = 874_724_710  # the first MovieLens-100K timestamp
_SPAN_S = 3 * 365 * 86_400


def _power_law_weights(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Zipf-like weights over n entities, randomly assigned to ids."""
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent
    rng.shuffle(weights)
    return weights / weights.sum()


CHUNK = 262_144  # interactions per vectorised draw: bounds the candidates' memory
GUIDE_PER_ITEM = 4  # guide-table buckets per item: ~1 forward step per draw on average


class InverseCdf:
    """Draws from a discrete distribution by inverting its CDF, with a guide table.

    The answer is exactly ``np.searchsorted(cdf, u, side="right")`` (so the generated data
    does not depend on which is used), but each draw starts at the first index of its bucket
    of ``[0, 1)`` instead of binary-searching the whole CDF, then steps forward while the
    CDF is still <= u. Over a 1M-item power-law catalog: 4 passes, about 5x faster than
    ``searchsorted``, which was the costliest line of generating 10M interactions.
    """

    def __init__(self, weights: np.ndarray) -> None:
        cdf = np.cumsum(weights, dtype=np.float64)
        self.cdf = cdf / cdf[-1]
        self.buckets = GUIDE_PER_ITEM * len(weights)
        edges = np.arange(self.buckets, dtype=np.float64) / self.buckets
        self.guide = np.searchsorted(self.cdf, edges, side="right")

    def positions(self, u: np.ndarray) -> np.ndarray:
        """The index of each uniform draw in ``u`` (any shape, values in [0, 1))."""
        flat = u.ravel()
        last = len(self.cdf) - 1
        bucket = np.minimum((flat * self.buckets).astype(np.int64), self.buckets - 1)
        index = self.guide[bucket]
        active = np.flatnonzero(self.cdf[np.minimum(index, last)] <= flat)
        while active.size:
            index[active] += 1
            still = index[active] <= last
            active = active[still]
            active = active[self.cdf[index[active]] <= flat[active]]
        return np.minimum(index, last).reshape(u.shape)


def _pick_items(
    rng: np.random.Generator,
    user_idx: np.ndarray,
    item_weights: np.ndarray,
    user_factors: np.ndarray,
    item_factors: np.ndarray,
    candidates: int,
    strength: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Each interaction's item (``candidates`` popularity draws, one kept by a Gumbel-max
    over ``strength * affinity``) and its affinity."""
    scale = 1.0 / np.sqrt(user_factors.shape[1])
    popularity = InverseCdf(item_weights)
    items = np.empty(len(user_idx), dtype=np.int64)
    affinity = np.empty(len(user_idx), dtype=np.float32)
    for start in range(0, len(user_idx), CHUNK):
        users = user_idx[start : start + CHUNK]
        drawn = popularity.positions(rng.random((len(users), candidates)))
        scores = np.einsum("nd,nkd->nk", user_factors[users], item_factors[drawn]) * scale
        if candidates > 1 and strength > 0:
            keep = np.argmax(strength * scores + rng.gumbel(size=scores.shape), axis=1)
        else:
            keep = np.zeros(len(users), dtype=np.int64)
        rows = np.arange(len(users))
        items[start : start + CHUNK] = drawn[rows, keep]
        affinity[start : start + CHUNK] = scores[rows, keep]
    return items, affinity


def make_synthetic(
    n_users: int = 10_000,
    n_items: int = 5_000,
    n_interactions: int = 200_000,
    seed: int = 0,
    item_exponent: float = 1.0,
    user_exponent: float = 0.8,
    latent_dim: int = 8,
    preference_candidates: int = 16,
    preference_strength: float = 2.0,
) -> RawDataset:
    """Generate users, items and interactions with power-law popularity and activity and
    latent preferences (``preference_strength=0`` or one candidate: picks by popularity)."""
    if min(n_users, n_items, n_interactions) < 1:
        raise ConfigError("n_users, n_items and n_interactions must all be >= 1")
    if preference_candidates < 1 or preference_strength < 0:
        raise ConfigError(
            "preference_candidates must be >= 1 and preference_strength >= 0, got "
            f"{preference_candidates} and {preference_strength}"
        )
    rng = np.random.default_rng(seed)

    users = pd.DataFrame(
        {
            "user_id": np.arange(1, n_users + 1, dtype=np.int64),
            "age": rng.integers(12, 75, n_users).astype(np.int32),
            "gender": np.where(rng.random(n_users) < 0.7, "M", "F"),
            "occupation": np.asarray(OCCUPATIONS)[rng.integers(0, len(OCCUPATIONS), n_users)],
            "zip_code": np.char.zfill(rng.integers(0, 100_000, n_users).astype(str), 5),
        }
    )

    genre_count = rng.integers(1, 4, n_items)
    genre_picks = rng.integers(0, len(GENRES), (n_items, 3))
    genre_names = np.asarray(GENRES, dtype=object)[genre_picks]
    first = genre_names[:, 0]
    second = np.where(genre_count >= 2, GENRE_SEPARATOR + genre_names[:, 1], "")
    third = np.where(genre_count >= 3, GENRE_SEPARATOR + genre_names[:, 2], "")
    items = pd.DataFrame(
        {
            "item_id": np.arange(1, n_items + 1, dtype=np.int64),
            "title": np.char.add("item ", np.arange(1, n_items + 1).astype(str)),
            "year": rng.integers(1930, 1999, n_items).astype(np.float32),
            "genres": first + second + third,
        }
    )

    user_idx = rng.choice(
        n_users, n_interactions, p=_power_law_weights(n_users, user_exponent, rng)
    )
    item_weights = _power_law_weights(n_items, item_exponent, rng)
    user_factors = rng.normal(size=(n_users, latent_dim)).astype(np.float32)
    item_factors = rng.normal(size=(n_items, latent_dim)).astype(np.float32)
    item_idx, affinity = _pick_items(
        rng,
        user_idx,
        item_weights,
        user_factors,
        item_factors,
        preference_candidates,
        preference_strength,
    )
    centred = affinity - affinity.mean()
    rating = np.clip(np.rint(3.5 + centred + rng.normal(0, 0.6, n_interactions)), 1, 5)
    interactions = pd.DataFrame(
        {
            "user_id": user_idx.astype(np.int64) + 1,
            "item_id": item_idx.astype(np.int64) + 1,
            "rating": rating.astype(np.float32),
            "timestamp": (_START_TS + rng.integers(0, _SPAN_S, n_interactions)).astype(np.int64),
        }
    )
    name = f"synthetic-u{n_users}-i{n_items}-n{n_interactions}-s{seed}"
    return RawDataset(name, users, items, interactions, LatentTruth(user_factors, item_factors))
