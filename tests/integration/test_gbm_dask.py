"""LightGBM's Dask interface trains the tree ranker on a real 2-worker LocalCluster; the
model file is the one ``TreeRanker`` saves, loads back and scores. Not equal to the
single-process model (histograms merged across workers, bagging per worker): its test AUC
is checked against a floor instead."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from core.features.spec import LABEL
from core.tree_ranker import TreeRanker, categorical_positions, tree_categorical, tree_features
from pipelines.data.synthetic import make_synthetic
from pipelines.evaluation.metrics import auc
from pipelines.features_distributed import dask_client
from pipelines.prepare import prepare
from pipelines.storage import column_names
from pipelines.training.gbm_dask import train_tree_on_dask

pytestmark = pytest.mark.integration


def _inputs(path: Path, names: list[str]) -> np.ndarray:
    table = pq.read_table(path, columns=names)
    return np.stack([table.column(n).to_numpy() for n in names], axis=1)


def test_tree_ranker_trains_over_two_workers_and_scores(tmp_path: Path) -> None:
    dataset = make_synthetic(n_users=600, n_items=400, n_interactions=15_000, seed=5)
    workflow = prepare(dataset, tmp_path / "work", seed=0)
    train = tmp_path / "work" / "ranking_train.parquet"
    # small row groups: several partitions, so both workers hold training rows
    parted = tmp_path / "parted.parquet"
    pq.write_table(pq.read_table(train), parted, row_group_size=2_000)

    with dask_client(workers=2) as client:
        tree = train_tree_on_dask(client, [parted], workflow, seed=0, rounds=20, rows=2_000)
        workers = len(client.scheduler_info()["workers"])
    assert workers == 2
    assert tree.booster is not None and tree.booster.num_trees() == 20
    assert int(tree.booster.params["num_machines"]) == 2  # one LightGBM network of two

    tree.save(tmp_path / "tree.txt")
    loaded = TreeRanker.load(tmp_path / "tree.txt")
    schema = workflow.schema
    test = tmp_path / "work" / "ranking_test.parquet"
    sparse = [c for g in schema.sparse_columns for c in column_names(test, g)]
    dense = [c for g in ("dense", *schema.multi_hot_columns) for c in column_names(test, g)]
    inputs = {"sparse": _inputs(test, sparse).astype(np.int64), "dense": _inputs(test, dense)}
    picked = categorical_positions(schema.sparse_columns, tree_categorical(workflow))
    x, _ = tree_features(inputs, picked)
    logits = loaded.logits(x)
    np.testing.assert_array_equal(logits, tree.logits(x))
    labels = pq.read_table(test, columns=[LABEL]).column(LABEL).to_numpy()
    assert np.isfinite(logits).all() and len(logits) == len(labels)
    # it learnt: 0.81 when measured, as single-process LightGBM with the same 20 rounds
    assert auc(labels, logits) > 0.7


def test_no_files_is_an_error() -> None:
    with pytest.raises(ValueError, match="no ranking files"):
        train_tree_on_dask(None, [], None)  # type: ignore[arg-type]
