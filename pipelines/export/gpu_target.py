"""The export's GPU target: the ranker's two learnt parts published as Triton models of
their own (the tree model on the FIL backend, DLRM's dense part on ONNX Runtime) for the GPU
image, and the check that FIL will answer what LightGBM answers.

FIL does not run here; Treelite does. FIL imports a LightGBM text model through Treelite
and evaluates it in float32; Treelite's reference evaluator (GTIL) runs the imported model,
so comparing it with LightGBM on validation rows catches a model FIL would read differently
(categorical splits, missing values, the objective's sigmoid). The ranker blends on the
logit scale, so the check also measures the logit FIL's float32 probability gives back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.errors import ArtifactError
from core.export.repository import VersionWriter
from core.export.triton_gpu_configs import DENSE, TREE_MODEL, TREES, write_gpu_models
from core.logit import probability_logits
from core.tree_ranker import TreeRanker

TARGETS = ("cpu", "gpu", "gpu-tensorrt")
# GTIL and LightGBM both sum in float64: any difference above this is a misread model
PROBABILITY_TOLERANCE = 1e-6
# float32 probabilities turned back into logits lose about 6e-8 / p(1 - p): 1.3e-3 at a
# logit of 10, 1.1e-2 at 12, and above about 16 every logit reads as 16. The check holds rows
# up to LOGIT_CHECKED in size to LOGIT_TOLERANCE and counts those beyond as saturated.
LOGIT_CHECKED = 10.0
LOGIT_TOLERANCE = 1e-2


def triton_parts(target: str) -> dict[str, str]:
    """The models the ranker calls on Triton for ``target`` (blend.json's ``triton_parts``);
    empty for the CPU target, whose ranker scores in its own process."""
    if target not in TARGETS:
        raise ArtifactError(f"unknown Triton target {target!r}: expected one of {TARGETS}")
    return {} if target == "cpu" else {"trees": TREES, "dense": DENSE}


def fil_parity(model_text: Path, features: np.ndarray) -> dict[str, float]:
    """Max abs differences between LightGBM and the model as FIL imports it (Treelite):
    of the probabilities, and of the logits after a float32 round trip (rows whose logit is
    at most ``LOGIT_CHECKED`` in size), with the share of rows beyond (``saturated``).
    Raises ``ArtifactError`` above the tolerances."""
    import treelite  # the `train` extra; only the GPU target needs it

    rows = np.ascontiguousarray(features, dtype=np.float32)
    if rows.ndim != 2 or len(rows) == 0:
        raise ArtifactError(f"{model_text}: the parity check needs rows, got {rows.shape}")
    try:
        imported = treelite.frontend.load_lightgbm_model(str(model_text))
    except Exception as error:  # Treelite raises its own error type
        raise ArtifactError(f"{model_text}: Treelite (FIL's reader) refuses it: {error}") from error
    fil = np.asarray(treelite.gtil.predict(imported, rows), dtype=np.float64).reshape(-1)
    trees = TreeRanker.load(model_text)
    margins = trees.logits(rows).astype(np.float64)
    expected = 1 / (1 + np.exp(-margins))
    probability = float(np.max(np.abs(fil - expected)))
    checked = np.abs(margins) <= LOGIT_CHECKED
    errors = np.abs(probability_logits(fil.astype(np.float32)) - margins)[checked]
    logit = float(errors.max()) if errors.size else 0.0
    if not probability <= PROBABILITY_TOLERANCE or not logit <= LOGIT_TOLERANCE:
        raise ArtifactError(
            f"{model_text}: FIL (as Treelite reads it) differs from LightGBM by {probability:.2e} "
            f"in probability (> {PROBABILITY_TOLERANCE}) or {logit:.2e} in logit "
            f"(> {LOGIT_TOLERANCE})"
        )
    return {"probability": probability, "logit": logit, "saturated": float(1 - checked.mean())}


def export_gpu_parts(
    ranker_version: Path, writer: VersionWriter, target: str, features: np.ndarray
) -> dict[str, float]:
    """Check FIL's parity on ``features`` (tree inputs of validation rows), then publish the
    GPU models as ``writer``'s version; returns the parity figures for the manifest."""
    parity = fil_parity(ranker_version / TREE_MODEL, features)
    write_gpu_models(ranker_version, writer, tensorrt=target == "gpu-tensorrt")
    return parity
