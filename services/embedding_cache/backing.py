"""Redis as the backing tier: every row of every table, binary float32, versioned.

Key: ``{namespace}:emb:v{model_version}:{table}:{row}`` -> ``dim * 4`` bytes. A new model
version writes its own keys, so a version switch can never read the old version's rows.
Reads are one ``MGET`` per batch of misses (over ``RespConnection``, one per thread, for
``redis://`` URLs); writes are pipelined ``MSET`` chunks. ``{namespace}:emb:v{version}:tables``
(table -> rows, and the dim) is written after every row of a version, so a reader can tell a
completely materialized version from a missing or half-written one.
"""

from __future__ import annotations

import json
import threading
from itertools import pairwise
from typing import Any

import numpy as np
import redis

from services.embedding_cache.resp import RespConnection
from services.util.redis_client import sync_client

WRITE_CHUNK = 20_000
CLIENT_NAME = "cascade-embedding-cache"  # of the read connections, in CLIENT LIST


class RedisRows:
    """Sync Redis client for the cache (the ranker runs in worker threads / the Triton stub)."""

    def __init__(self, url: str, namespace: str = "cascade", timeout_s: float = 0.05) -> None:
        self.url = url
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._client: redis.Redis | None = None
        self._local = threading.local()  # one RespConnection per reading thread
        self._connections: list[RespConnection] = []

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = sync_client(self.url, self.timeout_s)
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
            prefix + b"%d" % key
            for prefix, keys in ((self.prefix(version, t).encode(), k) for t, k in wanted)
            for key in keys.tolist()
        ]
        values: list[Any] = self._mget(names) if names else []
        width = dim * 4
        if None not in values and set(map(len, values)) <= {width}:  # every row stored, whole
            rows = np.frombuffer(b"".join(values), dtype="<f4").reshape(-1, dim).copy()
            return self._split(wanted, rows, np.ones(len(values), dtype=bool))
        found = np.fromiter((v is not None and len(v) == width for v in values), bool, len(values))
        rows = np.zeros((len(values), dim), np.float32)
        if found.any():
            blob = b"".join(v for v, ok in zip(values, found, strict=True) if ok)
            rows[found] = np.frombuffer(blob, dtype="<f4").reshape(-1, dim)
        return self._split(wanted, rows, found)

    def _mget(self, names: list[bytes]) -> list[Any]:
        if not RespConnection.supports(self.url):
            return self.client.mget(names)
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = RespConnection(
                self.url, self.timeout_s, CLIENT_NAME
            )
            self._connections.append(connection)
        return connection.execute("MGET", *names)

    def mark_complete(self, version: int, tables: dict[str, int], dim: int) -> None:
        """Record that every row of ``tables`` of ``version`` is stored (write it last)."""
        spec = json.dumps({"tables": tables, "dim": dim})
        self.client.set(f"{self.namespace}:emb:v{version}:tables", spec)

    def stored_tables(self, version: int) -> dict[str, Any] | None:
        """``{"tables": {name: rows}, "dim": d}`` of a completely stored version, else None."""
        raw = self.client.get(f"{self.namespace}:emb:v{version}:tables")
        return None if raw is None else json.loads(raw)

    @staticmethod
    def _split(
        wanted: list[tuple[str, np.ndarray]], rows: np.ndarray, found: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        bounds = np.cumsum([0] + [len(keys) for _, keys in wanted])
        return [(rows[a:b], found[a:b]) for a, b in pairwise(bounds)]

    def close(self) -> None:
        for connection in self._connections:
            connection.close()
        self._connections.clear()
        self._local = threading.local()
        if self._client is not None:
            self._client.close()
            self._client = None
