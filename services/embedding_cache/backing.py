"""Redis as the backing tier: every row of every table, binary float32, versioned.

Key: ``{namespace}:emb:v{model_version}:{table}:{row}`` -> ``dim * 4`` bytes. A new model
version writes its own keys, so a version switch can never read the old version's rows.
Reads are one ``MGET`` per batch of misses; writes are pipelined ``MSET`` chunks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import redis

WRITE_CHUNK = 20_000


class RedisRows:
    """Sync Redis client for the cache (the ranker runs in worker threads / the Triton stub)."""

    def __init__(self, url: str, namespace: str = "cascade", timeout_s: float = 0.05) -> None:
        self.url = url
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._client: redis.Redis | None = None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(
                self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s
            )
        return self._client

    def prefix(self, version: int, table: str) -> str:
        return f"{self.namespace}:emb:v{version}:{table}:"

    def write_table(self, version: int, table: str, weights: np.ndarray) -> int:
        """Store every row of ``weights`` under this version; return the rows written."""
        weights = np.ascontiguousarray(weights, dtype="<f4")
        prefix = self.prefix(version, table)
        pipe = self.client.pipeline(transaction=False)
        for start in range(0, len(weights), WRITE_CHUNK):
            chunk = weights[start : start + WRITE_CHUNK]
            pipe.mset({f"{prefix}{start + i}": row.tobytes() for i, row in enumerate(chunk)})
            if len(pipe) >= 8:
                pipe.execute()
        pipe.execute()
        return len(weights)

    def fetch(
        self, version: int, table: str, keys: np.ndarray, dim: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``[len(keys), dim]`` and a found mask, in one MGET (raises on Redis errors)."""
        return self.fetch_many(version, [(table, keys)], dim)[0]

    def fetch_many(
        self, version: int, wanted: list[tuple[str, np.ndarray]], dim: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(rows, found)`` per ``(table, keys)``, all in ONE MGET (raises on Redis errors)."""
        names = [
            f"{self.prefix(version, table)}{k}" for table, keys in wanted for k in keys.tolist()
        ]
        values: list[Any] = self.client.mget(names) if names else []
        results, start = [], 0
        for _, keys in wanted:
            part = values[start : start + len(keys)]
            start += len(keys)
            found = np.fromiter(
                (v is not None and len(v) == dim * 4 for v in part), bool, len(part)
            )
            rows = np.zeros((len(keys), dim), np.float32)
            if found.any():
                blob = b"".join(v for v, ok in zip(part, found, strict=True) if ok)
                rows[found] = np.frombuffer(blob, dtype="<f4").reshape(-1, dim)
            results.append((rows, found))
        return results

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
