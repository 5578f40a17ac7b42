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

from core.logit import probability_logits
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


class TritonParts:
    """A GPU-target ranker's learnt parts as models of the same Triton server, called with
    business-logic scripting (BLS): DLRM's dense part (``logit`` from ``dense`` and
    ``embedded``) and the trees (FIL's ``output__0``: the probability, turned back into a
    logit for the blend). Each call names the ranker's own version, so a canary's ranker
    never scores with production's parts. A part's error is raised: ``score_requests`` then
    answers each request with it, and the gateway degrades that answer."""

    def __init__(self, pb_utils: Any, names: dict[str, str], version: int) -> None:
        self.pb_utils = pb_utils
        self.dense_model, self.trees_model = names["dense"], names["trees"]
        self.version = version

    def _infer(self, model: str, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
        pb = self.pb_utils
        options: dict[str, Any] = {}
        if hasattr(pb, "PreferredMemory"):  # the answer in host memory: the blend is numpy
            options["preferred_memory"] = pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0)
        request = pb.InferenceRequest(
            model_name=model,
            model_version=self.version,
            requested_output_names=[output],
            inputs=[output_tensor(pb.Tensor, name, array) for name, array in inputs.items()],
            **options,
        )
        response = request.exec()
        if response.has_error():
            raise RuntimeError(f"{model} version {self.version}: {response.error().message()}")
        tensor = pb.get_output_tensor_by_name(response, output)
        if tensor is None:
            raise RuntimeError(f"{model} version {self.version} answered without {output}")
        if not tensor.is_cpu():  # a GPU model's output, where host memory was not honoured
            return torch.from_dlpack(tensor.to_dlpack()).cpu().numpy()
        return np.array(input_array(tensor))  # a copy: the response's memory is freed next

    def dense_logits(self, dense: np.ndarray, embedded: np.ndarray) -> np.ndarray:
        inputs = {"dense": dense, "embedded": np.ascontiguousarray(embedded, dtype=np.float32)}
        return self._infer(self.dense_model, inputs, "logit").reshape(-1)

    def tree_logits(self, features: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(features, dtype=np.float32)
        return probability_logits(self._infer(self.trees_model, {"input__0": rows}, "output__0"))
