"""Inference on a Triton server (HTTP or gRPC, asyncio clients): the same two models,
addressed by name and version."""

from __future__ import annotations

from typing import Any

import numpy as np

from services.inference.backends import QUERY_TOWER, RANKER, InferenceBackend

_TRITON_TYPES = {np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32"}


class TritonBackend(InferenceBackend):
    """``tritonclient`` asyncio client; one ``infer`` per call."""

    def __init__(self, url: str, protocol: str = "http") -> None:
        self.url = url
        self.protocol = protocol
        self._client: Any = None
        self._module: Any = None

    async def start(self, versions: list[int]) -> None:
        if self.protocol == "grpc":
            import tritonclient.grpc as module
            import tritonclient.grpc.aio as aio
        else:
            import tritonclient.http as module
            import tritonclient.http.aio as aio
        self._module = module
        self._client = aio.InferenceServerClient(self.url)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def ready(self, model: str, version: int) -> bool:
        return bool(await self._client.is_model_ready(model, str(version)))

    async def _infer(
        self, model: str, version: int, inputs: dict[str, np.ndarray], outputs: list[str]
    ) -> list[np.ndarray]:
        if self._client is None:
            raise RuntimeError("TritonBackend.start() was not called")
        tensors = []
        for name, array in inputs.items():
            tensor = self._module.InferInput(name, list(array.shape), _TRITON_TYPES[array.dtype])
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        requested = [self._module.InferRequestedOutput(name) for name in outputs]
        result = await self._client.infer(
            model, tensors, model_version=str(version), outputs=requested
        )
        return [result.as_numpy(name) for name in outputs]

    async def encode_query(
        self, version: int, user_features: np.ndarray, history: np.ndarray
    ) -> np.ndarray:
        inputs = {
            "user_features": user_features.astype(np.int64),
            "history": history.astype(np.int64),
        }
        return (await self._infer(QUERY_TOWER, version, inputs, ["embedding"]))[0]

    async def rank(
        self, version: int, sparse: np.ndarray, dense: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        inputs: dict[str, np.ndarray] = {
            "sparse": sparse.astype(np.int64),
            "dense": dense.astype(np.float32),
        }
        score, degraded = await self._infer(RANKER, version, inputs, ["score", "degraded"])
        return score, bool(np.asarray(degraded).any())
