"""Event weights (a dataset file's ``weight:``) reach the ranking models' losses; data sets
without weights train exactly as before (no weight column at all)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from core.features.schema import MOVIELENS
from core.tree_ranker import TreeRanker
from pipelines.data.synthetic import make_synthetic
from pipelines.prepare import prepare
from pipelines.training.ranking import ranking_inputs, weighted

DATA = make_synthetic(80, 60, 3_000, seed=2)


def test_weighted_rows_carry_their_weight_into_the_ranking_splits(tmp_path: Path) -> None:
    interactions = DATA.interactions.copy()
    interactions["weight"] = np.where(np.arange(len(interactions)) % 3 == 0, 3.0, 1.0)
    prepare(dataclasses.replace(DATA, interactions=interactions), tmp_path / "w")
    train = ranking_inputs(tmp_path / "w" / "ranking_train.parquet", MOVIELENS)
    assert weighted(tmp_path / "w" / "ranking_train.parquet")
    assert set(np.unique(train["weight"]).tolist()) == {1.0, 3.0}

    prepare(DATA, tmp_path / "plain")
    assert not weighted(tmp_path / "plain" / "ranking_train.parquet")
    assert "weight" not in ranking_inputs(tmp_path / "plain" / "ranking_train.parquet", MOVIELENS)


def test_the_trees_learn_from_the_weights() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2_000, 3))
    y = (rng.random(2_000) < 0.5).astype(np.float32)
    plain, heavy = TreeRanker(), TreeRanker()
    plain.fit(x, y, x, y, [], rounds=5, threads=1)
    heavy.fit(x, y, x, y, [], rounds=5, threads=1, weight=np.where(y > 0, 5.0, 1.0))
    assert heavy.logits(x).mean() > plain.logits(x).mean() + 0.1  # positives weigh more
