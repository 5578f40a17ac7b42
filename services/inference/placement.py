"""Where each model runs: the query tower in the gateway process, the ranker on Triton.

The query tower is tiny (an ONNX run of tens of microseconds): a round trip to Triton and
its python stub costs many times that in CPU and a serial hop in latency. The ranker stays
on Triton, where batching across requests and process isolation pay. Both placements load
each version's own exported files, so canary and version switches mean the same.
"""

from __future__ import annotations

import numpy as np

from services.inference.backends import InferenceBackend, LocalBackend


class PlacedBackend(InferenceBackend):
    """The query tower on ``query`` (in process), the ranker on ``ranker`` (Triton)."""

    def __init__(self, query: LocalBackend, ranker: InferenceBackend) -> None:
        self.query = query
        self.ranker = ranker

    def __repr__(self) -> str:
        return f"PlacedBackend(query={self.query!r}, ranker={self.ranker!r})"

    async def start(self, versions: list[int]) -> None:
        await self.ranker.start(versions)
        await self.query.start(versions)

    async def close(self) -> None:
        await self.query.close()
        await self.ranker.close()

    async def serve_versions(self, versions: list[int]) -> None:
        """The ranker's server first: when it refuses a version, nothing changed here."""
        await self.ranker.serve_versions(versions)
        await self.query.serve_versions(versions)

    async def encode_query(
        self, version: int, user_features: np.ndarray, history: np.ndarray
    ) -> np.ndarray:
        return await self.query.encode_query(version, user_features, history)

    async def rank(
        self, version: int, sparse: np.ndarray, dense: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        return await self.ranker.rank(version, sparse, dense)
