"""The tree ranker trained over a Dask cluster by LightGBM's own Dask interface, for ranking
data that outgrows one process.

Each worker reads its partitions (row groups) of ``ranking_train.parquet`` files and builds
the tree inputs there; LightGBM joins the workers into one training network (a socket per
worker, on the workers' own addresses) and every worker ends with the same trees. The model
is saved as ``TreeRanker`` saves it, so the export and serving do not change. It is not the
single-process model: data-parallel LightGBM builds histograms per worker and merges them,
and bagging draws per worker, so the trees differ (their quality is comparable, not equal);
there is no early stopping, so ``rounds`` trees are built.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import getitem
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pyarrow.parquet as pq
from dask import delayed
from distributed import Client

from core.features.spec import DENSE, LABEL, WEIGHT
from core.features.workflow import Workflow
from core.tree_ranker import (
    TREE_PARAMS,
    TreeRanker,
    categorical_positions,
    tree_categorical,
    tree_features,
)
from pipelines.storage import column_names

PARTITION_ROWS = 1 << 20  # rows per partition: whole row groups up to about this many
_ARRAYS = ("x", "label", "weight")


def _params(seed: int, rounds: int) -> dict[str, Any]:
    """``TreeRanker.fit``'s parameters (fixed ``rounds``: no early stopping on Dask; each
    worker uses its own threads)."""
    return {**TREE_PARAMS, "seed": seed, "verbose": -1, "n_estimators": rounds}


def _pieces(paths: Sequence[Path], rows: int) -> list[tuple[Path, tuple[int, ...], int]]:
    """(file, row groups, row count) of about ``rows`` rows each, in file order."""
    out = []
    for path in paths:
        metadata = pq.ParquetFile(path).metadata
        group: list[int] = []
        size = 0
        for i in range(metadata.num_row_groups):
            n = metadata.row_group(i).num_rows
            if group and size + n > rows:
                out.append((Path(path), tuple(group), size))
                group, size = [], 0
            group.append(i)
            size += n
        if group:
            out.append((Path(path), tuple(group), size))
    return out


def _read(
    path: Path, groups: tuple[int, ...], workflow: Workflow, picked: list[int]
) -> dict[str, np.ndarray]:
    """Runs on a worker: the tree inputs ``x``, ``label`` and ``weight`` of these row groups."""
    schema = workflow.schema
    sparse = [c for g in schema.sparse_columns for c in column_names(path, g)]
    dense = [c for g in (DENSE, *schema.multi_hot_columns) for c in column_names(path, g)]
    names = pq.ParquetFile(path).schema_arrow.names
    weight = [WEIGHT] if WEIGHT in names else []
    table = pq.ParquetFile(path).read_row_groups(list(groups), [*sparse, *dense, LABEL, *weight])
    column: dict[str, np.ndarray] = {n: table.column(n).to_numpy() for n in table.column_names}
    inputs: dict[str, np.ndarray] = {
        "sparse": np.stack([column[c] for c in sparse], axis=1).astype(np.int64),
        "dense": np.stack([column[c] for c in dense], axis=1).astype(np.float32),
    }
    x, _ = tree_features(inputs, picked)
    label = column[LABEL].astype(np.float32)
    rows = len(label)
    return {
        "x": x,
        "label": label,
        "weight": column[WEIGHT].astype(np.float32) if weight else np.ones(rows, np.float32),
    }


def train_tree_on_dask(
    client: Client,
    paths: Sequence[Path],
    workflow: Workflow,
    seed: int = 0,
    rounds: int = 200,
    rows: int = PARTITION_ROWS,
) -> TreeRanker:
    """A ``TreeRanker`` trained by LightGBM over the workers of ``client`` on the ranking
    rows of ``paths`` (``ranking_train.parquet`` files written with ``workflow``)."""
    import lightgbm.dask as lgb_dask  # needs scikit-learn: the `distributed` extra

    if not paths:
        raise ValueError("no ranking files to train on")
    picked = categorical_positions(workflow.schema.sparse_columns, tree_categorical(workflow))
    pieces = _pieces(paths, rows)
    width = len(column_names(pieces[0][0], DENSE)) + sum(
        len(column_names(pieces[0][0], g)) for g in workflow.schema.multi_hot_columns
    )
    features = width + len(picked)
    shared = client.scatter(workflow, broadcast=True)
    # partitions placed round robin: every worker holds rows, so every worker trains
    workers = sorted(client.scheduler_info()["workers"])
    parts = []
    for i, (path, groups, n) in enumerate(pieces):
        where = {"workers": [workers[i % len(workers)]], "allow_other_workers": False}
        read = client.submit(_read, path, groups, shared, picked, **where)
        parts.append(({k: client.submit(getitem, read, k, **where) for k in _ARRAYS}, n))

    def array(name: str, *width: int) -> da.Array:
        return da.concatenate(
            [
                da.from_delayed(delayed(futures[name]), shape=(n, *width), dtype=np.float32)
                for futures, n in parts
            ]
        )

    x = array("x", features)
    model = lgb_dask.DaskLGBMClassifier(client=client, **_params(seed, rounds))
    model.fit(
        x,
        array("label"),
        sample_weight=array("weight"),
        categorical_feature=list(range(width, features)),
    )
    return TreeRanker(model.booster_)
