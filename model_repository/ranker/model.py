"""Triton python-backend adapter of the ranker: tensors in, tensors out; nothing else."""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from services.inference.models import RankingModel

# Tensors cross the stub boundary through DLPack: the stub shipped in the nvidia-pytriton
# wheel reads and writes numpy 2 arrays incorrectly through as_numpy()/Tensor().


class TritonPythonModel:
    def initialize(self, args):
        self.model = RankingModel(Path(args["model_repository"]) / args["model_version"])
        self.model.load()

    def execute(self, requests):
        responses = []
        for request in requests:  # one response per request; errors reported per request
            try:
                sparse = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "sparse"))
                dense = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "dense"))
                scores, degraded = self.model.score(sparse, dense)
                score = scores.astype(np.float32).reshape(-1, 1)
                flags = np.full_like(score, float(degraded))
                responses.append(
                    pb_utils.InferenceResponse(
                        [
                            pb_utils.Tensor.from_dlpack("score", score),
                            pb_utils.Tensor.from_dlpack("degraded", flags),
                        ]
                    )
                )
            except Exception as error:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))))
        return responses

    def finalize(self):
        self.model.close()
