"""ONNX export of the query tower, the item tower and the DLRM dense part, checked against
torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from core.errors import ArtifactError
from pipelines.models.dlrm import DLRMDense
from pipelines.models.two_tower import QueryTower, ServedQuery, TwoTower
from pipelines.models.two_tower_ensemble import EnsembleQuery, TwoTowerEnsemble

OPSET = 17
TOLERANCE = 1e-4


def _export(
    module: torch.nn.Module, inputs: dict[str, torch.Tensor], outputs: list[str], path: Path
) -> None:
    module.eval()
    axes = {name: {0: "batch"} for name in [*inputs, *outputs]}
    torch.onnx.export(
        module,
        tuple(inputs.values()),
        str(path),
        input_names=list(inputs),
        output_names=outputs,
        dynamic_axes=axes,
        opset_version=OPSET,
        dynamo=False,
    )


def check_onnx(module: torch.nn.Module, path: Path, inputs: dict[str, torch.Tensor]) -> float:
    """Max abs difference of ONNX Runtime vs torch on ``inputs``; raises above the tolerance."""
    with torch.no_grad():
        expected = module(*inputs.values()).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
    difference = float(np.max(np.abs(got - expected))) if expected.size else 0.0
    if not np.isfinite(difference) or difference > TOLERANCE:
        raise ArtifactError(
            f"{path}: ONNX output differs from torch by {difference:.2e} (> {TOLERANCE})"
        )
    return difference


def export_query_tower(
    tower: QueryTower | ServedQuery | EnsembleQuery,
    user_features: np.ndarray,
    history: np.ndarray,
    path: Path,
) -> float:
    """Write ``model.onnx`` (inputs ``user_features``, ``history``; output ``embedding``)."""
    sample = {
        "user_features": torch.from_numpy(user_features[:64]),
        "history": torch.from_numpy(history[:64]),
    }
    _export(tower, sample, ["embedding"], path)
    return check_onnx(tower, path, sample)


def export_dlrm_dense(
    dense_part: DLRMDense, dense: np.ndarray, embedded: np.ndarray, path: Path
) -> float:
    """Write the DLRM dense part (inputs ``dense``, ``embedded``; output ``logit``)."""
    sample = {"dense": torch.from_numpy(dense[:64]), "embedded": torch.from_numpy(embedded[:64])}
    _export(dense_part, sample, ["logit"], path)
    return check_onnx(dense_part, path, sample)


class ServedItems(nn.Module):
    """The item tower as the ANN index holds its vectors (``served_items``): what a catalog
    update runs on new or changed items, without the training work directory."""

    def __init__(self, model: TwoTower | TwoTowerEnsemble) -> None:
        super().__init__()
        self.model = model

    def forward(self, item_features: torch.Tensor, item_dense: torch.Tensor) -> torch.Tensor:
        return self.model.served_items(item_features, item_dense)


def export_item_tower(
    model: TwoTower | TwoTowerEnsemble,
    item_features: np.ndarray,
    item_dense: np.ndarray,
    path: Path,
) -> float:
    """Write the item tower (inputs ``item_features``, ``item_dense``; output ``embedding``)."""
    sample = {
        "item_features": torch.from_numpy(item_features[:64]),
        "item_dense": torch.from_numpy(item_dense[:64]),
    }
    served = ServedItems(model)
    _export(served, sample, ["embedding"], path)
    return check_onnx(served, path, sample)


def run_item_tower(path: Path, item_features: np.ndarray, item_dense: np.ndarray) -> np.ndarray:
    """The served vectors of items, from an exported item tower (ONNX Runtime, CPU)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {
        "item_features": np.ascontiguousarray(item_features, dtype=np.int64),
        "item_dense": np.ascontiguousarray(item_dense, dtype=np.float32),
    }
    return np.asarray(session.run(None, inputs)[0], dtype=np.float32)
