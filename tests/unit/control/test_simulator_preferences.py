"""The simulator's ground truth without a generator's latent truth (MovieLens): rated items
by their rating, unrated ones by the rating a completion of all ratings predicts."""

from __future__ import annotations

import dataclasses

import numpy as np

from control.simulator import UNRATED_INTEREST, Preferences
from pipelines.data.synthetic import make_synthetic


def test_unrated_items_are_judged_by_their_predicted_rating() -> None:
    generated = make_synthetic(200, 100, 8000, seed=1)
    ratings_only = dataclasses.replace(generated, truth=None)  # as MovieLens: ratings, no truth
    prefs = Preferences(ratings_only)
    rows = generated.interactions
    liked = rows[rows["rating"] == 5].iloc[0]
    user = int(liked["user_id"])
    assert prefs.relevance(user, np.array([int(liked["item_id"])]))[0] > 0.8  # rated 5
    rated = set(rows.loc[rows["user_id"] == user, "item_id"])
    unrated = np.asarray([i for i in range(1, 101) if i not in rated])
    relevance = prefs.relevance(user, unrated)
    assert (relevance <= UNRATED_INTEREST).all() and relevance.std() > 0
    assert prefs.completion is not None
    predicted = prefs.completion.predict(np.full(len(unrated), user), unrated)
    assert np.array_equal(np.argsort(relevance), np.argsort(predicted))
