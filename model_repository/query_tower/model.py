"""Triton python-backend adapter of the query tower: tensors in, tensors out; nothing else."""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from services.inference.triton_python import input_array, keep_imports_lean, output_tensor

keep_imports_lean()  # before the models' module imports LightGBM

from services.inference.models import QueryTowerModel  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        self.model = QueryTowerModel(Path(args["model_repository"]) / args["model_version"])
        self.model.load()

    def execute(self, requests):
        responses = []
        for request in requests:  # one response per request; errors reported per request
            try:
                features = input_array(pb_utils.get_input_tensor_by_name(request, "user_features"))
                history = input_array(pb_utils.get_input_tensor_by_name(request, "history"))
                embedding = self.model.encode(features, history).astype(np.float32)
                responses.append(
                    pb_utils.InferenceResponse(
                        [output_tensor(pb_utils.Tensor, "embedding", embedding)]
                    )
                )
            except Exception as error:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))))
        return responses
