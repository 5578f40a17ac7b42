from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.data.rating_completion import fit_rating_completion
from pipelines.data.synthetic import make_synthetic


def test_the_completion_predicts_ratings_it_never_saw() -> None:
    rows = make_synthetic(200, 100, 8000, seed=1).interactions
    held = np.random.default_rng(0).random(len(rows)) < 0.1
    completion = fit_rating_completion(rows[~held], rank=8, sweeps=10)
    predicted = completion.predict(rows["user_id"][held], rows["item_id"][held])
    actual = rows["rating"][held].to_numpy()
    assert np.sqrt(np.mean((predicted - actual) ** 2)) < 0.85 * actual.std()
    assert np.corrcoef(predicted, actual)[0, 1] > 0.5


def test_unknown_ids_get_the_mean_and_fitting_is_seeded() -> None:
    rows = pd.DataFrame(
        {"user_id": [1, 1, 2, 3], "item_id": [1, 2, 1, 3], "rating": [5.0, 1.0, 4.0, 3.0]}
    )
    a, b = fit_rating_completion(rows, rank=2), fit_rating_completion(rows, rank=2)
    assert a.predict(np.array([99]), np.array([98]))[0] == a.mean == 3.25
    assert np.array_equal(
        a.predict(rows["user_id"], rows["item_id"]), b.predict(rows["user_id"], rows["item_id"])
    )
