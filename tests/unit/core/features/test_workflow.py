from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.errors import ArtifactError
from core.features.ops import Columns
from core.features.rows import AttributeTable, join_rows, labelled_rows
from core.features.schema import MOVIELENS
from core.features.spec import DENSE, default_workflow
from core.features.workflow import Workflow
from pipelines.data.schema import RawDataset
from pipelines.split import random_split

GENRES = "genres_multi_hot"
MODEL_INPUTS = (*MOVIELENS.sparse_columns, DENSE, GENRES)
USER_ATTRIBUTES, ITEM_ATTRIBUTES = MOVIELENS.user_attributes, MOVIELENS.item_attributes


def _fitted(dataset: RawDataset) -> tuple[Workflow, Columns, AttributeTable, AttributeTable]:
    users = AttributeTable(dataset.users, "user_id", USER_ATTRIBUTES)
    items = AttributeTable(dataset.items, "item_id", ITEM_ATTRIBUTES)
    rows = labelled_rows(dataset.interactions, users, items)
    split = random_split(len(dataset.interactions), seed=0)
    workflow = default_workflow()
    workflow.fit_transform({k: v[split.train] for k, v in rows.items()})
    test = {k: v[split.test] for k, v in rows.items()}
    return workflow, test, users, items


def test_saved_workflow_transforms_identically(small_dataset: RawDataset, tmp_path: Path) -> None:
    workflow, test, _, _ = _fitted(small_dataset)
    workflow.save(tmp_path / "wf")
    loaded = Workflow.load(tmp_path / "wf")
    before, after = workflow.transform(test), loaded.transform(test)
    for column in MODEL_INPUTS:
        np.testing.assert_array_equal(before[column], after[column])


def test_offline_and_online_features_are_identical(
    small_dataset: RawDataset, tmp_path: Path
) -> None:
    """Rows built per request (one user x candidate items, attributes as strings the way an
    online store returns them) through the saved workflow equal the offline batch features."""
    workflow, test, _, _ = _fitted(small_dataset)
    offline = workflow.transform(test)
    workflow.save(tmp_path / "wf")
    online_workflow = Workflow.load(tmp_path / "wf")

    as_stored = small_dataset.users.astype({"age": str})  # a key-value store hands back text
    users = AttributeTable(as_stored, "user_id", USER_ATTRIBUTES)
    items = AttributeTable(small_dataset.items, "item_id", ITEM_ATTRIBUTES)
    for user in np.unique(test["user_id"])[:25]:
        mine = np.flatnonzero(test["user_id"] == user)
        request = join_rows(
            users, items, np.full(len(mine), user), test["item_id"][mine], test["timestamp"][mine]
        )
        online = online_workflow.transform(request)
        for column in MODEL_INPUTS:
            np.testing.assert_array_equal(online[column], offline[column][mine], err_msg=column)


def test_unknown_ids_online_get_null_buckets(small_dataset: RawDataset) -> None:
    workflow, _, users, items = _fitted(small_dataset)
    request = join_rows(
        users, items, np.array([10**9]), np.array([10**9]), np.array([1_000_000_000])
    )
    out = workflow.transform(request)
    assert out["user_id_idx"][0] == 1 and out["gender_idx"][0] == 0 and out["year_idx"][0] == 0
    assert np.isfinite(out[DENSE]).all()


def test_partial_transform_skips_ops_without_inputs(small_dataset: RawDataset) -> None:
    workflow, _, _, _ = _fitted(small_dataset)
    items = small_dataset.items
    out = workflow.transform(
        {c: items[c].to_numpy() for c in ("item_id", "year", "genres")}, partial=True
    )
    assert {"item_id_idx", "year_idx", GENRES, "item_id_idx_count", "item_mean_user_age"} <= set(
        out
    )
    assert "user_id_idx" not in out and DENSE not in out
    with pytest.raises(KeyError):
        workflow.transform({c: items[c].to_numpy() for c in ("item_id", "year", "genres")})


def test_load_reports_a_missing_workflow(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="fitted workflow is missing"):
        Workflow.load(tmp_path)


def test_load_rejects_unknown_format_and_op(small_dataset: RawDataset, tmp_path: Path) -> None:
    workflow, _, _, _ = _fitted(small_dataset)
    workflow.save(tmp_path)
    spec = json.loads((tmp_path / "workflow.json").read_text())
    (tmp_path / "workflow.json").write_text(json.dumps({**spec, "format_version": 99}))
    with pytest.raises(ArtifactError, match="format_version 99"):
        Workflow.load(tmp_path)
    spec["ops"][0]["kind"] = "teleport"
    (tmp_path / "workflow.json").write_text(json.dumps(spec))
    with pytest.raises(ArtifactError, match="unknown op kind 'teleport'"):
        Workflow.load(tmp_path)
    (tmp_path / "workflow.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        Workflow.load(tmp_path)
