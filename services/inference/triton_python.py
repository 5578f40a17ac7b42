"""What the thin Triton python-backend ``model.py`` files share (importable, unit-tested).

Output tensors cross the stub boundary through DLPack from a torch tensor, not from numpy:
the stub in the nvidia-pytriton wheel reads and writes numpy 2 arrays incorrectly through
``as_numpy()``/``Tensor()`` (it was built against numpy 1), and after consuming a DLPack
capsule it renames it ``used_dlpack`` instead of the standard ``used_dltensor``. numpy's
capsule destructor then fails (``PyCapsule_GetPointer called with incorrect name``, printed
as a traceback into the server log for every output tensor of every request); torch's
destructor leaves a capsule renamed by its consumer alone, as the DLPack protocol says.
The stub frees the tensor through the DLPack deleter either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch  # at model load, not in the first request (it takes about a second)


def output_tensor(tensor_type: Any, name: str, array: np.ndarray) -> Any:
    """``tensor_type.from_dlpack(name, ...)`` (``pb_utils.Tensor``) of ``array``, shared
    with it through a torch tensor (no copy for a contiguous array)."""
    return tensor_type.from_dlpack(name, torch.from_numpy(np.ascontiguousarray(array)))


def input_array(tensor: Any) -> np.ndarray:
    """A request's input tensor as numpy (the stub's capsule is consumed correctly)."""
    return np.from_dlpack(tensor)
