"""Where the models run: in this process (embedded default) or on a Triton server.

Both backends take the model version per call, so one gateway can serve a canary version
beside the production one.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from services.inference.models import QueryTowerModel, RankingModel

if TYPE_CHECKING:
    from services.settings import Settings

QUERY_TOWER = "query_tower"
RANKER = "ranker"


class InferenceBackend(ABC):
    @abstractmethod
    async def start(self, versions: list[int]) -> None:
        """Prepare the given model versions."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def serve_versions(self, versions: list[int]) -> None:
        """Have exactly these model versions ready (load the missing ones, drop the rest);
        raise when one cannot be loaded (the versions that served before keep serving)."""

    @abstractmethod
    async def encode_query(
        self, version: int, user_features: np.ndarray, history: np.ndarray
    ) -> np.ndarray:
        """``[B, F]`` ids + ``[B, L]`` history -> ``[B, D]`` embeddings."""

    @abstractmethod
    async def rank(
        self, version: int, sparse: np.ndarray, dense: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        """``[N, T]`` ids + ``[N, D]`` dense -> ``[N]`` scores (one call for all candidates), and
        whether the ranker served default embedding rows (its cache's store failed)."""


class LocalBackend(InferenceBackend):
    """The exported ONNX/LightGBM artifacts in process.

    The ranker runs in a worker thread (onnxruntime and LightGBM release the GIL, and a call
    takes milliseconds); the query tower runs on the calling thread: its ONNX run is tens of
    microseconds, less than a hop through the thread pool. ``models`` picks which of the two
    this backend holds (the query tower alone when the ranker is on Triton).
    """

    def __init__(
        self,
        model_repository: Path,
        settings: Settings | None = None,
        models: tuple[str, ...] = (QUERY_TOWER, RANKER),
    ) -> None:
        unknown = set(models) - {QUERY_TOWER, RANKER}
        if unknown:
            raise ValueError(f"unknown models {sorted(unknown)}: expected query_tower/ranker")
        self.model_repository = model_repository
        self.settings = settings  # the ranker's embedding rows follow it (None: environment)
        self.models = models
        self.versions: set[int] = set()
        self.query: dict[int, QueryTowerModel] = {}
        self.ranker: dict[int, RankingModel] = {}

    async def start(self, versions: list[int]) -> None:
        for version in versions:
            if QUERY_TOWER in self.models:
                query = QueryTowerModel(self.model_repository / QUERY_TOWER / str(version))
                await asyncio.to_thread(query.load)
                self.query[version] = query
            if RANKER in self.models:
                ranker = RankingModel(
                    self.model_repository / RANKER / str(version), settings=self.settings
                )
                await asyncio.to_thread(ranker.load)
                self.ranker[version] = ranker
            self.versions.add(version)

    async def close(self) -> None:
        for ranker in self.ranker.values():
            ranker.close()
        self.query.clear()
        self.ranker.clear()
        self.versions.clear()

    async def serve_versions(self, versions: list[int]) -> None:
        await self.start([v for v in versions if v not in self.versions])
        for version in [v for v in self.versions if v not in versions]:
            if version in self.ranker:
                self.ranker.pop(version).close()
            self.query.pop(version, None)
            self.versions.discard(version)

    async def encode_query(
        self, version: int, user_features: np.ndarray, history: np.ndarray
    ) -> np.ndarray:
        return self.query[version].encode(user_features, history)

    async def rank(
        self, version: int, sparse: np.ndarray, dense: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        return await asyncio.to_thread(self.ranker[version].score, sparse, dense)
