"""Test doubles: an inference backend that wraps the real in-process one and injects faults."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from services.inference.backends import InferenceBackend, LocalBackend


class FaultyBackend(InferenceBackend):
    """The real LocalBackend, except for the fault named by ``mode``:
    ``ok``, ``nan``, ``wrong_shape``, ``raise``, ``slow`` (sleeps ``delay_s`` first) or
    ``embeddings_degraded`` (the ranker reports default embedding rows)."""

    def __init__(self, model_repository: Path, mode: str = "ok", delay_s: float = 0.5) -> None:
        self.inner = LocalBackend(model_repository)
        self.mode = mode
        self.delay_s = delay_s

    async def start(self, versions: list[int]) -> None:
        await self.inner.start(versions)

    async def close(self) -> None:
        await self.inner.close()

    async def serve_versions(self, versions: list[int]) -> None:
        await self.inner.serve_versions(versions)

    async def _fault(self, result: np.ndarray) -> np.ndarray:
        if self.mode == "raise":
            raise ConnectionError("inference server refused the connection")
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
        if self.mode == "nan":
            return np.full_like(result, np.nan)
        if self.mode == "wrong_shape":
            return result[:-1]
        return result

    async def encode_query(
        self, version: int, user_features: np.ndarray, history: np.ndarray
    ) -> np.ndarray:
        return await self._fault(await self.inner.encode_query(version, user_features, history))

    async def rank(
        self, version: int, sparse: np.ndarray, dense: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        scores, degraded = await self.inner.rank(version, sparse, dense)
        return await self._fault(scores), degraded or self.mode == "embeddings_degraded"
