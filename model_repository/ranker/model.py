"""Triton python-backend adapter of the ranker: tensors in, tensors out; nothing else.

All requests Triton hands one ``execute()`` are scored together (one embedding lookup, one
DLRM run, one LightGBM call); each gets its own response or error.
"""

from pathlib import Path

import triton_python_backend_utils as pb_utils

from services.inference.triton_python import (
    TritonParts,
    keep_imports_lean,
    ranker_inputs,
    ranker_response,
)

keep_imports_lean()  # before the models' modules import LightGBM

from services.embedding_cache.triton_metrics import TritonMetricsMirror  # noqa: E402
from services.inference.models import RankingModel  # noqa: E402
from services.inference.ranker_batch import score_requests  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        self.model = RankingModel(Path(args["model_repository"]) / args["model_version"])
        self.model.load()
        if self.model.triton_parts:  # a GPU-target version: its parts are models of their own
            self.model.parts = TritonParts(
                pb_utils, self.model.triton_parts, int(args["model_version"])
            )
        self.metrics = TritonMetricsMirror(pb_utils)  # the embedding cache's counters

    def execute(self, requests):
        inputs = [ranker_inputs(pb_utils, request) for request in requests]
        outcomes = score_requests(self.model, inputs)
        self.metrics.sync()
        return [ranker_response(pb_utils, outcome) for outcome in outcomes]

    def finalize(self):
        self.metrics.sync(force=True)
        self.model.close()
