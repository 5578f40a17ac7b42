"""Triton python-backend adapter of the ranker: tensors in, tensors out; nothing else."""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from services.embedding_cache.triton_metrics import TritonMetricsMirror
from services.inference.models import RankingModel
from services.inference.triton_python import input_array, output_tensor


class TritonPythonModel:
    def initialize(self, args):
        self.model = RankingModel(Path(args["model_repository"]) / args["model_version"])
        self.model.load()
        self.metrics = TritonMetricsMirror(pb_utils)  # the embedding cache's counters

    def execute(self, requests):
        responses = []
        for request in requests:  # one response per request; errors reported per request
            try:
                sparse = input_array(pb_utils.get_input_tensor_by_name(request, "sparse"))
                dense = input_array(pb_utils.get_input_tensor_by_name(request, "dense"))
                scores, degraded = self.model.score(sparse, dense)
                score = scores.astype(np.float32).reshape(-1, 1)
                flags = np.full_like(score, float(degraded))
                responses.append(
                    pb_utils.InferenceResponse(
                        [
                            output_tensor(pb_utils.Tensor, "score", score),
                            output_tensor(pb_utils.Tensor, "degraded", flags),
                        ]
                    )
                )
            except Exception as error:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))))
        self.metrics.sync()
        return responses

    def finalize(self):
        self.metrics.sync(force=True)
        self.model.close()
