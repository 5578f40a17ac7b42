"""What the thin Triton python-backend ``model.py`` files share (importable, unit-tested).

Output tensors cross the stub boundary through DLPack from a torch tensor, not from numpy:
the stub in the nvidia-pytriton wheel reads and writes numpy 2 arrays incorrectly through
``as_numpy()``/``Tensor()`` (it was built against numpy 1), and after consuming a DLPack
capsule it renames it ``used_dlpack`` instead of the standard ``used_dltensor``. numpy's
capsule destructor then fails (``PyCapsule_GetPointer called with incorrect name``, printed
as a traceback into the server log for every output tensor of every request); torch's
destructor leaves a capsule renamed by its consumer alone, as the DLPack protocol says.
The stub frees the tensor through the DLPack deleter either way.

Every load of a model version starts a stub, which imports what ``model.py`` imports before
the version serves: ``keep_imports_lean()`` keeps that to what a stub uses.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch  # at model load, not in the first request (it takes about a second)

from services.inference.ranker_batch import Outcome, RankerInputs


def keep_imports_lean() -> None:
    """Keep LightGBM from importing scikit-learn (and with it SciPy's statistics) in this
    process: a stub scores with ``lightgbm.Booster`` alone, and LightGBM imports scikit-learn
    only for its estimator API (it checks with ``try: import``). Call it in a stub's
    ``model.py`` before anything imports LightGBM; never in a process that may use sklearn."""
    if "lightgbm" not in sys.modules:
        sys.modules.setdefault("sklearn", None)  # type: ignore[arg-type]  # "not installed"


def output_tensor(tensor_type: Any, name: str, array: np.ndarray) -> Any:
    """``tensor_type.from_dlpack(name, ...)`` (``pb_utils.Tensor``) of ``array``, shared
    with it through a torch tensor (no copy for a contiguous array)."""
    return tensor_type.from_dlpack(name, torch.from_numpy(np.ascontiguousarray(array)))


def input_array(tensor: Any) -> np.ndarray:
    """A request's input tensor as numpy (the stub's capsule is consumed correctly)."""
    return np.from_dlpack(tensor)


def ranker_inputs(pb_utils: Any, request: Any) -> RankerInputs | Exception:
    """A ranker request's ``sparse``/``dense`` tensors, or the error reading them."""
    try:
        return RankerInputs(
            input_array(pb_utils.get_input_tensor_by_name(request, "sparse")),
            input_array(pb_utils.get_input_tensor_by_name(request, "dense")),
        )
    except Exception as error:
        return error


def ranker_response(pb_utils: Any, outcome: Outcome) -> Any:
    """The ``InferenceResponse`` of one ranker request: scores and degraded flags ``[N, 1]``,
    or the request's error (reported, never raised)."""
    if isinstance(outcome, Exception):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(outcome)))
    score = outcome.scores.astype(np.float32).reshape(-1, 1)
    flags = np.full_like(score, float(outcome.degraded))
    return pb_utils.InferenceResponse(
        [
            output_tensor(pb_utils.Tensor, "score", score),
            output_tensor(pb_utils.Tensor, "degraded", flags),
        ]
    )
