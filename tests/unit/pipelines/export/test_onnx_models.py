from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from core.errors import ArtifactError
from pipelines.export.onnx_models import check_onnx, export_dlrm_dense, export_query_tower
from pipelines.models.dlrm import DLRM
from pipelines.models.two_tower import ItemTower, QueryTower, TwoTower
from pipelines.models.two_tower_ensemble import TwoTowerEnsemble


@pytest.mark.parametrize("skip", [False, True])
def test_query_tower_onnx_matches_torch_for_other_batch_sizes(tmp_path: Path, skip: bool) -> None:
    torch.manual_seed(0)
    tower = QueryTower([4, 6], n_items=30, skip=skip)
    features = np.random.default_rng(0).integers(0, 4, (100, 2))
    history = np.random.default_rng(1).integers(0, 30, (100, 5))
    difference = export_query_tower(tower, features, history, tmp_path / "q.onnx")
    assert difference < 1e-4
    session = ort.InferenceSession(str(tmp_path / "q.onnx"))
    out = session.run(None, {"user_features": features[:3], "history": history[:3]})[0]
    with torch.no_grad():
        expected = tower(torch.from_numpy(features[:3]), torch.from_numpy(history[:3])).numpy()
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_an_ensembles_query_exports_as_one_onnx_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    members = [
        TwoTower(QueryTower([4, 6], n_items=30), ItemTower([30], n_dense=1, bias=True))
        for _ in range(2)
    ]
    query = TwoTowerEnsemble(members).served_query()
    features = np.random.default_rng(0).integers(0, 4, (100, 2))
    history = np.random.default_rng(1).integers(0, 30, (100, 5))
    assert export_query_tower(query, features, history, tmp_path / "q.onnx") < 1e-4
    session = ort.InferenceSession(str(tmp_path / "q.onnx"))
    out = session.run(None, {"user_features": features[:3], "history": history[:3]})[0]
    with torch.no_grad():
        expected = query(torch.from_numpy(features[:3]), torch.from_numpy(history[:3])).numpy()
    np.testing.assert_allclose(out, expected, atol=1e-5)
    assert out.shape == (3, 2 * (64 + 1))  # each member: its unit vector and the bias's 1


def test_dlrm_dense_export_and_a_mismatch_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = DLRM([5, 7], n_dense=3, dim=8)
    dense = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    with torch.no_grad():
        embedded = model.embed(torch.randint(0, 5, (10, 2))).numpy()
    path = tmp_path / "d.onnx"
    assert export_dlrm_dense(model.dense_part, dense, embedded, path) < 1e-4
    other = DLRM([5, 7], n_dense=3, dim=8).dense_part  # different weights than the file
    with pytest.raises(ArtifactError, match="differs from torch"):
        check_onnx(
            other, path, {"dense": torch.from_numpy(dense), "embedded": torch.from_numpy(embedded)}
        )
