"""The Triton model.py files import what a stub uses, not scikit-learn through LightGBM
(``services.inference.triton_python.keep_imports_lean``): each version's stub start pays for
every import. Run in fresh interpreters, as a stub is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]

# a stub's view: pb_utils exists, model.py runs as a file; then LightGBM has to score
STUB = """
import json, runpy, sys, types
import numpy as np
sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
namespace = runpy.run_path(sys.argv[1])
import lightgbm
data = lightgbm.Dataset(np.arange(400.0).reshape(200, 2), np.arange(200) % 2)
booster = lightgbm.train({"objective": "binary", "verbose": -1}, data, num_boost_round=3)
print(json.dumps({
    "model": "TritonPythonModel" in namespace,
    "sklearn_imported": any(
        m.split(".")[0] == "sklearn" and sys.modules[m] is not None for m in sys.modules
    ),
    "scored": len(booster.predict(np.zeros((4, 2)))),
}))
"""


def _run(code: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("model", ["ranker", "query_tower"])
def test_a_stub_scores_with_lightgbm_without_importing_scikit_learn(model: str) -> None:
    seen = _run(STUB, str(ROOT / "model_repository" / model / "model.py"))
    assert seen == {"model": True, "sklearn_imported": False, "scored": 4}


def test_an_already_imported_scikit_learn_is_left_alone() -> None:
    seen = _run(
        "import json, sys, sklearn\n"
        "from services.inference.triton_python import keep_imports_lean\n"
        "keep_imports_lean()\n"
        "import lightgbm\n"
        "print(json.dumps({'kept': sys.modules['sklearn'] is sklearn,"
        " 'estimators': lightgbm.compat.SKLEARN_INSTALLED}))"
    )
    assert seen == {"kept": True, "estimators": True}
