"""Gradient-boosted tree ranker (LightGBM), pointwise on the ranking label."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import lightgbm as lgb
import numpy as np

from core.features.spec import cardinality
from core.features.workflow import Workflow

# Sparse columns with more values than this are not tree categories: user and item ids and
# long-tailed attributes (a zip code) would overfit.
TREE_MAX_CATEGORIES = 100


def tree_categorical(workflow: Workflow) -> tuple[str, ...]:
    """The low-cardinality sparse columns the trees treat as categories."""
    return tuple(
        c
        for c in workflow.schema.sparse_columns[2:]  # never the user and item ids
        if cardinality(workflow, c) <= TREE_MAX_CATEGORIES
    )


def categorical_positions(sparse_columns: Sequence[str], categorical: Sequence[str]) -> list[int]:
    """Where the tree's categorical columns sit in the sparse input."""
    return [list(sparse_columns).index(c) for c in categorical]


def tree_features(
    inputs: dict[str, np.ndarray], picked: Sequence[int]
) -> tuple[np.ndarray, list[int]]:
    """Tree inputs: the dense block then the sparse columns at ``picked``
    (``categorical_positions``); returns the categorical feature positions."""
    x = np.concatenate([inputs["dense"], inputs["sparse"][:, picked].astype(np.float32)], axis=1)
    return x, list(range(inputs["dense"].shape[1], x.shape[1]))


# The trees' shape and learning parameters, shared by every trainer of the model (one
# process here, LightGBM's Dask interface in pipelines/training/gbm_dask.py).
TREE_PARAMS: dict[str, object] = {
    "objective": "binary",
    "learning_rate": 0.05,
    "num_leaves": 63,
    "min_data_in_leaf": 40,
    "feature_fraction": 0.8,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "lambda_l2": 1.0,
}


class TreeRanker:
    """LightGBM binary classifier whose logit is the ranking score."""

    def __init__(self, booster: lgb.Booster | None = None) -> None:
        self.booster = booster

    def fit(
        self,
        train_x: np.ndarray,
        train_y: np.ndarray,
        valid_x: np.ndarray,
        valid_y: np.ndarray,
        categorical: list[int],
        seed: int = 0,
        rounds: int = 400,
        threads: int = 2,
        weight: np.ndarray | None = None,
    ) -> dict[str, list[float]]:
        """Train with early stopping on the validation logloss (``weight``: per training row,
        default 1); return the per-round curves."""
        params = {
            **TREE_PARAMS,
            "seed": seed,
            "num_threads": threads,
            "verbose": -1,
            "metric": "binary_logloss",
            "deterministic": True,
        }
        train = lgb.Dataset(
            train_x, train_y, weight=weight, categorical_feature=categorical, free_raw_data=False
        )
        valid = lgb.Dataset(valid_x, valid_y, reference=train, categorical_feature=categorical)
        curves: dict[str, dict[str, list[float]]] = {}
        self.booster = lgb.train(
            params,
            train,
            num_boost_round=rounds,
            valid_sets=[train, valid],
            valid_names=["train", "valid"],
            callbacks=[lgb.early_stopping(30, verbose=False), lgb.record_evaluation(curves)],
        )
        return {name: values["binary_logloss"] for name, values in curves.items()}

    def logits(self, x: np.ndarray, threads: int = 1) -> np.ndarray:
        """Raw scores (log-odds). One thread by default: serving calls are small and run
        beside other work, where an OpenMP team per call only spins and contends."""
        assert self.booster is not None, "fit or load first"
        return np.asarray(
            self.booster.predict(
                x, raw_score=True, num_iteration=self.booster.best_iteration, num_threads=threads
            ),
            dtype=np.float32,
        )

    def save(self, path: Path) -> None:
        assert self.booster is not None, "fit first"
        self.booster.save_model(str(path), num_iteration=self.booster.best_iteration)

    @classmethod
    def load(cls, path: Path) -> TreeRanker:
        return cls(lgb.Booster(model_file=str(path)))
